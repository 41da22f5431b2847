"""mmvit_ext: vision-transformer backbones for dense prediction in the OpenMMLab ecosystem.

Tested stacks: requirements/oldest.txt (Python 3.9, torch 2.1.2, mmcv 2.1.0) and
requirements/dev.txt (Python 3.11, torch 2.11, torchvision 0.26, mmcv 2.1.0 built
from source, mmengine 0.10.7, mmdet 3.3.0, mmsegmentation 1.2.2, mmpretrain 1.2.0, numpy < 2.
The ranges below are what the code needs (docs/install.md); none of them has an upper bound on
torch or a pin on mmcv, so installing into an existing environment never upgrades torch or
replaces a self-built mmcv.
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


_peers = {
    'det': ['mmdet>=3.3.0,<4'],
    'seg': ['mmsegmentation>=1.2.2,<2', 'ftfy', 'regex'],  # mmseg imports ftfy / regex, undeclared
    'cls': ['mmpretrain>=1.2.0,<2'],
}
_extras = {
    **_peers,
    # ONNX export (mmvit_ext.deploy, tools/deployment); needs torch >= 2.6 besides
    'deploy': ['onnx>=1.16', 'onnxruntime>=1.18', 'onnxscript>=0.3'],
    # the test suite: reference implementations and layouts it compares against; transformers
    # from 4.56 breaks mmpretrain 1.2.0's import beside pycocotools (mmvit_ext.utils.env_check)
    'tests': ['pytest', 'timm>=1.0', 'transformers>=4.40,<4.56', 'safetensors', 'matplotlib',
              'pycocotools'],
}
_extras['all'] = sorted({req for reqs in _extras.values() for req in reqs})

setup(
    name='mmvit_ext',
    version=_version,
    description='Swin, PVTv2, DeepViT, CaiT, Refined-ViT and plain ViT backbones for '
                'mmdet / mmseg / mmpretrain',
    long_description=(_here / 'README.md').read_text() if (_here / 'README.md').exists() else '',
    long_description_content_type='text/markdown',
    packages=find_packages(include=['mmvit_ext', 'mmvit_ext.*']),
    cmdclass={'build_py': BuildPyWithConfigs},
    python_requires='>=3.9',  # the oldest stack CI runs (requirements/oldest.txt)
    install_requires=[
        'torch>=2.1',            # torch_compat.NEEDS: what needs a newer one
        'mmengine>=0.10.0,<1',
        'mmcv>=2.0.0rc4,<2.2.0',  # mmdet 3.3 / mmseg 1.2.2's range; we use no mmcv op ourselves
        'numpy<2',                # mmcv 2.1.0 and pycocotools wheels built against numpy 1.x
        'Pillow',
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
