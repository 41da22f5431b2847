"""Run one of the repository's tools in a subprocess, as a user would: the one runner of the
test suite."""
import subprocess
import sys
from pathlib import Path
from typing import Union

ROOT = Path(__file__).resolve().parents[1]


def tool_process(*args: Union[str, Path], cwd: Path = ROOT, timeout: float = 1500
                 ) -> subprocess.CompletedProcess:
    """``python ARGS...`` (a tool path and its arguments) in ``cwd``; the finished process, for
    tests that check a failure too."""
    return subprocess.run([sys.executable, *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)


def run_tool(*args: Union[str, Path], cwd: Path = ROOT, timeout: float = 1500) -> str:
    """As :func:`tool_process`, failing with the tool's output unless it succeeds; returns
    stdout + stderr."""
    result = tool_process(*args, cwd=cwd, timeout=timeout)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout + result.stderr
