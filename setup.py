"""mmvit_ext: vision-transformer backbones for dense prediction in the OpenMMLab ecosystem."""
import re
from pathlib import Path

from setuptools import find_packages, setup

_here = Path(__file__).parent
_version = re.search(r"__version__ = '([^']+)'",
                     (_here / 'mmvit_ext' / 'version.py').read_text()).group(1)

setup(
    name='mmvit_ext',
    version=_version,
    description='Swin, PVTv2, DeepViT, CaiT and Refined-ViT backbones for mmdet / mmseg / mmpretrain',
    long_description=(_here / 'README.md').read_text() if (_here / 'README.md').exists() else '',
    long_description_content_type='text/markdown',
    packages=find_packages(include=['mmvit_ext', 'mmvit_ext.*']),
    python_requires='>=3.8',
    install_requires=[
        'torch>=2.1',
        'mmengine>=0.10,<1',
        'mmcv>=2.0,<2.2',
        'numpy',
    ],
    extras_require={
        'det': ['mmdet>=3.0,<4'],
        'seg': ['mmsegmentation>=1.0,<2', 'ftfy', 'regex'],
        'cls': ['mmpretrain>=1.0,<2'],
        'all': ['mmdet>=3.0,<4', 'mmsegmentation>=1.0,<2', 'ftfy', 'regex', 'mmpretrain>=1.0,<2',
                'safetensors', 'matplotlib', 'pycocotools'],
        'deploy': ['onnx>=1.16', 'onnxruntime>=1.18', 'onnxscript>=0.3'],
        'tests': ['pytest', 'timm'],
    },
    license='Apache-2.0',
    zip_safe=False,
)
