"""Check a backbone against the official model code (families that name it: ``official_code``).

The official repository is only *read* from the path you give (nothing of it is copied here):
its model is built with random weights (BatchNorm statistics and LayerScale randomised too, so
no branch hides behind an identity init), saved as a timm-style training checkpoint, loaded into
our backbone through ``init_cfg`` (layout auto-detected, converted) and both are run on the same
images. Prints the max-abs-diff of the normalised class token, and of the logits through the
official head.

Example:
    git clone https://github.com/zhoudaquan/dvit_repo /tmp/dvit_repo
    python tools/analysis/official_parity.py deepvit:s --repo /tmp/dvit_repo
    python tools/analysis/official_parity.py refiner:s --repo /tmp/Refiner_ViT
"""
import argparse
import importlib
import sys
import tempfile
from pathlib import Path

import torch
from torch import nn

import mmvit_ext  # noqa: F401
from mmvit_ext.backbones import family_classes

def randomise(model: nn.Module, seed: int = 0) -> None:
    """Non-trivial BatchNorm statistics / affine and LayerScale-like gains."""
    gen = torch.Generator().manual_seed(seed)
    for module in model.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            module.running_mean.copy_(torch.randn(module.num_features, generator=gen) * 0.1)
            module.running_var.copy_(torch.rand(module.num_features, generator=gen) + 0.5)
            module.weight.data.copy_(torch.rand(module.num_features, generator=gen) + 0.5)
            module.bias.data.copy_(torch.randn(module.num_features, generator=gen) * 0.1)
    for name, param in model.named_parameters():
        if name.endswith(('scale_channel', 'gamma_1', 'gamma_2')):
            param.data.copy_(torch.rand(param.shape, generator=gen) * 0.2 + 0.05)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('backbone', help='FAMILY:ARCH, e.g. deepvit:s, refiner:s')
    parser.add_argument('--repo', required=True, help='checkout of the official repository')
    parser.add_argument('--batch', type=int, default=2)
    args = parser.parse_args()
    family, _, arch = args.backbone.partition(':')
    official_code = {f: cls for f, cls in family_classes().items() if cls.official_code}
    if family not in official_code or arch not in official_code[family].official_code[1]:
        parser.error(f'unknown backbone {args.backbone!r}; choose from '
                     + ', '.join(f'{f}:{a}' for f, cls in official_code.items()
                                 for a in cls.official_code[1]))
    cls = official_code[family]
    module_name, constructors = cls.official_code
    sys.path.append(str(Path(args.repo).resolve()))  # appended: the installed timm stays first
    official_module = importlib.import_module(module_name)
    torch.manual_seed(0)
    official = getattr(official_module, constructors[arch])().eval()
    randomise(official)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / 'official.pth.tar'
        torch.save({'epoch': 1, 'arch': constructors[arch], 'state_dict': official.state_dict()},
                   path)
        ours = cls(arch=arch, **cls.classifier_settings(),
                   init_cfg=dict(type='Pretrained', checkpoint=str(path)))
        ours.init_weights()
    ours.eval()
    images = torch.randn(args.batch, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        theirs = official.forward_features(images)
        theirs = (theirs[0] if isinstance(theirs, tuple) else theirs)
        theirs = theirs[:, 0] if theirs.dim() == 3 else theirs
        mine = ours(images)[0]
        logits_diff = (official.head(theirs) - official.head(mine)).abs().max().item()
    n_official = sum(p.numel() for p in official.parameters())
    n_ours = sum(p.numel() for p in ours.parameters())
    diff = (theirs - mine).abs().max().item()
    print(f'{args.backbone}: official params {n_official / 1e6:.2f} M (with heads), ours '
          f'{n_ours / 1e6:.2f} M (trunk); class-token max-abs-diff {diff:.3g}, '
          f'logits max-abs-diff {logits_diff:.3g}')


if __name__ == '__main__':
    main()
