"""mmvit_ext: vision-transformer backbones for dense prediction in the OpenMMLab ecosystem.

OpenMMLab's packages and their maintained OneDL forks install the same import packages under
other distribution names, so the core requirements name neither: the extras ``openmmlab`` /
``onedl`` (and ``det`` / ``seg`` / ``cls`` or their ``onedl-`` twins) pick one, and ``pip install
.`` into an existing environment installs nothing else. No upper bound on torch, no pin on mmcv.
A new environment installs torch and mmcv's compiled ops first (docs/install.md); the tested
stacks are the files under requirements/.
"""
import re
import shutil
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

_here = Path(__file__).parent
_version = re.search(r"__version__ = '([^']+)'",
                     (_here / 'mmvit_ext' / 'version.py').read_text()).group(1)

# mmengine resolves `mmvit_ext::dir/file.py` through .mim/model-index.yml first; an empty
# index sends every name to .mim/configs (the `_base_` path).
MODEL_INDEX = 'Import: []\n'


class BuildPyWithConfigs(build_py):
    """build_py that also copies configs/ into the package as mmvit_ext/.mim/configs (the layout
    mmdet / mmseg / mmpretrain ship), so `_base_` inheritance works from an installed wheel.
    An editable install needs no copy: mmvit_ext.config_files finds the checkout's configs/."""

    def run(self) -> None:
        super().run()
        if getattr(self, 'editable_mode', False):
            return
        source = _here / 'configs'
        target = Path(self.build_lib) / 'mmvit_ext' / '.mim'
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(source, target / 'configs',
                        ignore=shutil.ignore_patterns('__pycache__', '*.pyc'))
        (target / 'model-index.yml').write_text(MODEL_INDEX)


# OpenMMLab's distributions and the OneDL forks of the same import packages
# (mmvit_ext.distributions.PACKAGES); each environment holds one of the two.
_runtime = {
    'openmmlab': ['mmengine>=0.10.0,<1', 'mmcv>=2.0.0rc4,<2.2.0'],  # mmdet 3.3 / mmseg 1.2's range
    'onedl': ['onedl-mmengine>=0.10.12,<1', 'onedl-mmcv>=2.3.6,<3'],
}
_peers = {
    'det': ['mmdet>=3.3.0,<4'],
    'seg': ['mmsegmentation>=1.2.2,<2', 'ftfy', 'regex'],  # mmseg imports ftfy / regex, undeclared
    'cls': ['mmpretrain>=1.2.0,<2'],
    'onedl-det': ['onedl-mmdetection>=3.5.1,<4'],
    'onedl-seg': ['onedl-mmsegmentation>=1.4.2,<2', 'ftfy', 'regex'],
    'onedl-cls': ['onedl-mmpretrain>=1.3.6,<2'],
}
_extras = {
    **_runtime,
    **_peers,
    # ONNX export (mmvit_ext.deploy, tools/deployment); needs torch >= 2.6 besides
    'deploy': ['onnx>=1.16', 'onnxruntime>=1.18', 'onnxscript>=0.3'],
    # the test suite: reference implementations and layouts it compares against
    # the test suite beside a stack: what tests/ imports (tests/test_install_lines.py checks);
    # timm, Hugging Face and vit-pytorch models are its references
    'tests': ['pytest', 'pytest-xdist', 'timm>=1.0', 'transformers>=4.40', 'safetensors', 'matplotlib',
              'pycocotools', 'onnx>=1.16', 'onnxruntime>=1.18', 'onnxscript>=0.3', 'vit-pytorch',
              'pyyaml', 'packaging', 'scipy'],  # scipy: the official EoMT / Mask2Former matcher
}
# everything of one kind: OpenMMLab's stack (the OneDL one is the onedl* extras together).
# OpenMMLab's last mmpretrain (1.2.0) fails to import beside transformers >= 4.56 and
# pycocotools (mmvit_ext/utils/env_check.py, KNOWN_BREAKS), so the whole stack keeps it below.
_extras['all'] = sorted({req for name, reqs in _extras.items() if not name.startswith('onedl')
                         for req in reqs} - {'transformers>=4.40'} | {'transformers>=4.40,<4.56'})

setup(
    name='mmvit_ext',
    version=_version,
    description='Swin, PVTv2, DeepViT, CaiT, Refined-ViT and plain ViT backbones for '
                'mmdet / mmseg / mmpretrain',
    long_description=(_here / 'README.md').read_text() if (_here / 'README.md').exists() else '',
    long_description_content_type='text/markdown',
    packages=find_packages(include=['mmvit_ext', 'mmvit_ext.*']),
    cmdclass={'build_py': BuildPyWithConfigs},
    python_requires='>=3.9',  # the oldest tested stack (requirements/oldest.txt, run by hand)
    install_requires=[
        'torch>=2.1',  # torch_compat.NEEDS: what needs a newer one
        # torch 2.1 (the oldest stack, Python 3.9) is built against numpy 1; numpy 2 elsewhere
        'numpy<2; python_version < "3.10"',
        'numpy; python_version >= "3.10"',
        'Pillow',
        # mmengine / mmcv: the extras 'openmmlab' or 'onedl' (import mmvit_ext names both)
    ],
    extras_require=_extras,
    license='Apache-2.0',
    license_files=['LICENSE'],
    classifiers=[
        'License :: OSI Approved :: Apache Software License',
        'Programming Language :: Python :: 3',
        'Programming Language :: Python :: 3.9',
        'Programming Language :: Python :: 3.11',
        'Programming Language :: Python :: 3.12',
        'Operating System :: OS Independent',
        'Topic :: Scientific/Engineering :: Artificial Intelligence',
    ],
    zip_safe=False,
)
