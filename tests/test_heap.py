"""retain_freed_memory: a freed large block is reused without faulting its pages in again."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PROBE = '''
import resource, torch
from mmvit_ext.utils import retain_freed_memory

def faults_of_a_reused_block():
    block = torch.ones(2 ** 24)  # 64 MB, above glibc's largest mmap threshold
    del block
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    block = torch.ones(2 ** 24)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

default = faults_of_a_reused_block()
assert retain_freed_memory()
faults_of_a_reused_block()  # the heap grows once
print(default, faults_of_a_reused_block())
'''


def test_retained_heap_reuses_pages_instead_of_faulting_them_in():
    """By default glibc unmaps a 64 MB block on free, so the next one faults in all ~16k pages;
    with the heap retained (run in a subprocess: the setting is process-wide) it faults in
    almost none."""
    result = subprocess.run([sys.executable, '-c', PROBE], cwd=ROOT, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    default, retained = map(int, result.stdout.split())
    assert default > 10000  # 64 MB / 4 KB pages = 16384
    assert retained < default // 20
