"""What 0.2.0 removed says so in one line: ``flags.kernels``, and ``MMVIT_EXT_KERNELS`` set to
anything but ``portable`` (the one value it takes)."""
import os
import subprocess
import sys

import pytest

from mmvit_ext import flags


@pytest.mark.parametrize('name', ['kernels', 'KERNEL_CHOICES'])
def test_removed_flag_names_what_replaced_it(name):
    with pytest.raises(AttributeError) as info:
        getattr(flags, name)
    message = str(info.value)
    assert message.startswith(f'mmvit_ext.flags.{name} is gone: the CPU kernels')
    assert 'portable model code' in message and 'flags.fused_attention(False)' in message
    assert '\n' not in message
    assert not hasattr(flags, 'kernels')  # hasattr still answers False
    with pytest.raises(AttributeError, match="has no attribute 'not_a_flag'"):
        flags.not_a_flag  # noqa: B018


def _import_with(env_value):
    env = {k: v for k, v in os.environ.items() if k != flags.KERNELS_ENV}
    if env_value is not None:
        env[flags.KERNELS_ENV] = env_value
    code = 'import warnings; warnings.simplefilter("default"); import mmvit_ext'
    return subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, env=env)


def test_kernels_env_var_is_one_warning_at_import():
    result = _import_with('auto')
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if 'MMVIT_EXT_KERNELS' in line]
    assert len(lines) == 1, result.stderr
    assert "UserWarning: mmvit_ext: MMVIT_EXT_KERNELS='auto' is ignored: the CPU kernels" \
        in lines[0] and 'portable model code' in lines[0]
    assert 'MMVIT_EXT_KERNELS' not in _import_with(None).stderr


def test_kernels_env_var_portable_is_quiet_and_names_what_it_turns_off(monkeypatch):
    monkeypatch.setenv(flags.KERNELS_ENV, ' Portable ')
    assert flags.warn_removed_kernels_env() is None
    monkeypatch.setenv(flags.KERNELS_ENV, 'cpu')
    with pytest.warns(UserWarning, match="MMVIT_EXT_KERNELS='cpu' is ignored"):
        line = flags.warn_removed_kernels_env()
    assert line.endswith('(MMVIT_EXT_KERNELS=portable still turns the device kernels of '
                         'mmvit_ext.ops off)')
