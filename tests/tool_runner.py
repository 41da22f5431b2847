"""Run one of the repository's tools in a subprocess, as a user would, failing with its output."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_tool(*args: str, timeout: float = 1500) -> str:
    """``python TOOL ARGS...`` from the repository root; returns stdout + stderr."""
    result = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                            timeout=timeout)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout + result.stderr
