"""What a built ``mmcv._ext`` holds: the CUDA version it was compiled for, the GPU archs of its
kernels (read from the fatbinary headers in the shared object, so no cuobjdump and no GPU are
needed) and the number of CUDA kernel launchers. Used by tools/dev/build_gpu_wheels.py and its
rehearsal.

Example:
    python tools/dev/mmcv_ext_info.py --expect-cuda 13.0 --expect-arch 9.0
    mmcv._ext: CUDA 13.0, kernels sm_90 x58, 312 CUDA kernel launchers: ok
"""
import argparse
import collections
import importlib.machinery
import importlib.util
import re
import struct
import sys
from pathlib import Path
from types import ModuleType

FATBIN_MAGIC = struct.pack('<I', 0xBA55ED50)


def fatbin_archs(data: bytes) -> dict:
    """``{'sm_90': n, 'ptx_90': m}``: the kernel images of every fatbinary in ``data``.

    A fatbinary is a header (magic, version, header size, payload size) and entries, each with
    its own header: kind (1 PTX, 2 ELF cubin), header size, payload size, ..., arch at byte 28.
    """
    archs = collections.Counter()
    pos = data.find(FATBIN_MAGIC)
    while pos != -1:
        _, _, header, size = struct.unpack_from('<IHHQ', data, pos)
        off, end = pos + header, pos + header + size
        while off + 32 <= min(end, len(data)):
            kind, _, entry_header, entry_size = struct.unpack_from('<HHIQ', data, off)
            if kind not in (1, 2) or entry_header == 0:
                break
            arch = struct.unpack_from('<I', data, off + 28)[0]
            archs[f'{"ptx" if kind == 1 else "sm"}_{arch}'] += 1
            off += entry_header + entry_size
        pos = data.find(FATBIN_MAGIC, max(end, pos + 4))
    return dict(archs)


def expected_archs(arch_list: str) -> set:
    """TORCH_CUDA_ARCH_LIST ('8.0;9.0+PTX', '8.6 9.0') -> {'sm_80', 'sm_90', 'ptx_90'}."""
    out = set()
    for item in re.split(r'[;,\s]+', arch_list.strip()):
        if not item:
            continue
        major, minor = re.match(r'(\d+)\.(\d+)', item).groups()
        out.add(f'sm_{major}{minor}')
        if item.upper().endswith('+PTX'):
            out.add(f'ptx_{major}{minor}')
    return out


def cuda_launchers(data: bytes) -> int:
    """How many distinct ``...CUDAKernelLauncher`` symbols the object holds."""
    return len(set(re.findall(rb'[A-Za-z0-9_]+CUDAKernelLauncher', data)))


def load_ext() -> ModuleType:
    """``mmcv._ext`` loaded on its own: mmcv's package ``__init__`` needs OpenCV, which the
    build venv lacks; the extension needs only torch."""
    import torch  # noqa: F401  (the extension links against torch's libraries)
    spec = importlib.util.find_spec('mmcv')
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit('mmcv is not installed')
    found = sorted(Path(spec.submodule_search_locations[0]).glob('_ext*.so'))
    if not found:
        raise SystemExit('mmcv has no compiled _ext')
    loader = importlib.machinery.ExtensionFileLoader('mmcv._ext', str(found[0]))
    ext = importlib.util.module_from_spec(importlib.util.spec_from_loader('mmcv._ext', loader))
    loader.exec_module(ext)
    return ext


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--expect-cuda', help='fail unless get_compiling_cuda_version() is this')
    parser.add_argument('--expect-arch', help='fail unless these TORCH_CUDA_ARCH_LIST archs are in')
    args = parser.parse_args()
    ext = load_ext()
    cuda = ext.get_compiling_cuda_version()
    with open(ext.__file__, 'rb') as f:
        data = f.read()
    archs, launchers = fatbin_archs(data), cuda_launchers(data)
    problems = []
    if args.expect_cuda and cuda != args.expect_cuda:
        problems.append(f'want CUDA {args.expect_cuda}')
    missing = expected_archs(args.expect_arch) - set(archs) if args.expect_arch else set()
    if missing:
        problems.append(f'no {", ".join(sorted(missing))} kernels')
    if not launchers:
        problems.append('no CUDA kernel launchers')
    kernels = ', '.join(f'{a} x{n}' for a, n in sorted(archs.items())) or 'none'
    print(f'mmcv._ext: CUDA {cuda}, kernels {kernels}, {launchers} CUDA kernel launchers: '
          + ('; '.join(problems) if problems else 'ok'))
    return 1 if problems else 0


if __name__ == '__main__':
    sys.exit(main())
