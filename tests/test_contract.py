"""The backbone contract (tests/contract.py), run over every backbone in the mmvit_ext registry;
every path runs the same portable model code on every device."""
import pytest

from mmvit_ext.backbones import BaseBackbone
from mmvit_ext.registry import MODELS
import contract
from backbone_cases import CASES, LARGE_SIZE_OK, SMALL


def _registered():
    MODELS.import_from_location()  # backbones only: a config may import mmvit_ext.heads
    return sorted(name for name, cls in MODELS.module_dict.items()
                  if isinstance(cls, type) and issubclass(cls, BaseBackbone))


def test_every_registered_backbone_has_cases():
    registered = _registered()
    assert registered, 'no backbone registered in the mmvit_ext scope'
    assert set(registered) <= set(CASES), f'no contract cases for {set(registered) - set(CASES)}'


SHAPE_CASES = [(name, i, size) for name, cases in CASES.items() for i in range(len(cases))
               for size in contract.SIZES if size != (513, 769) or (name, i) in LARGE_SIZE_OK]


@pytest.mark.parametrize('name,case,size', SHAPE_CASES)
def test_output_shapes_match_contract(name, case, size):
    contract.check_output_shapes(MODELS.get(name), CASES[name][case], size)


@pytest.mark.parametrize('name', sorted(CASES))
def test_out_indices_subset_and_negative(name):
    contract.check_out_indices_subset_and_negative(MODELS.get(name), SMALL[name])


@pytest.mark.parametrize('name', sorted(CASES))
def test_frozen_stages_freeze_params_and_modes(name):
    contract.check_frozen_stages(MODELS.get(name), SMALL[name])


@pytest.mark.parametrize('name', sorted(CASES))
def test_with_cp_same_outputs_and_grads(name):
    contract.check_with_cp(MODELS.get(name), SMALL[name])


@pytest.mark.parametrize('name', sorted(CASES))
def test_early_out_indices_train_every_parameter(name):
    contract.check_early_out_indices_train_every_parameter(MODELS.get(name), SMALL[name])


@pytest.mark.parametrize('name,case', [(n, i) for n, cases in CASES.items()
                                       for i in range(len(cases))])
def test_runs_on_the_meta_device(name, case):
    contract.check_meta_device(MODELS.get(name), CASES[name][case])


@pytest.mark.parametrize('scope', ['mmdet', 'mmseg', 'mmpretrain'])
@pytest.mark.parametrize('name', sorted(CASES))
def test_builds_through_downstream_registries(scope, name):
    registry = __import__(f'{scope}.registry', fromlist=['MODELS']).MODELS
    model = registry.build(dict(type=f'mmvit_ext.{name}', **SMALL[name]))
    assert type(model) is MODELS.get(name)


@pytest.mark.parametrize('suffix', ['.pth', '.safetensors'])
@pytest.mark.parametrize('name', sorted(CASES))
def test_state_dict_roundtrip_through_init_cfg(name, suffix, tmp_path):
    contract.check_state_dict_roundtrip(MODELS.get(name), SMALL[name], tmp_path / f'w{suffix}')


@pytest.mark.parametrize('name', sorted(CASES))
def test_bad_arguments_raise_clear_errors(name):
    contract.check_bad_arguments(MODELS.get(name), SMALL[name])


@pytest.mark.parametrize('name', sorted(CASES))
def test_checkpoint_of_unknown_layout_is_refused(name, tmp_path):
    contract.check_unknown_layout_refused(MODELS.get(name), SMALL[name], tmp_path / 'other.pth')


@pytest.mark.parametrize('name', sorted(CASES))
def test_autograd_contract_inplace_double_backward_hooks_threads(name):
    contract.check_autograd_contract(MODELS.get(name), SMALL[name])
