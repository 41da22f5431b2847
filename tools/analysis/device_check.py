"""The backbone contract on one device and dtype, for every registered family (its smallest case
in tests/backbone_cases.py): output shapes, the forward against float32 on CPU, finite forward +
backward under autocast, and (float32) ``with_cp`` gradients equal to the plain run.

Where the forward misses its tolerance, every convolution and linear layer is re-run alone on the
device in the reduced dtype against float32 on the same rounded inputs: when such a plain op is
already wrong, the row says ``platform`` and names it (a device or library bug, not the family's
code; e.g. oneDNN's AMX bf16 convolution, docs/install.md#known-breaks), and that family does not
fail the run. Prints one markdown row per family and exits non-zero when a check fails.

Example:
    python tools/analysis/device_check.py --device cuda --dtype bf16
"""
import argparse
import contextlib
import copy
import sys
from pathlib import Path
from typing import Dict, List

import torch

import mmvit_ext  # noqa: F401
from mmvit_ext.backbones import family_classes
from mmvit_ext.benchmark.measure import DTYPES
from mmvit_ext.registry import MODELS

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / 'tests'))
from backbone_cases import SMALL  # noqa: E402

# largest |device - CPU float32| over the largest |CPU float32| output, per dtype
TOLERANCE = {'fp32': 1e-4, 'bf16': 5e-2, 'fp16': 1e-2}
CP_SETTINGS = (True, 'attn', 'mlp', 1)


def autocast(device: torch.device, dtype: str):
    if dtype == 'fp32':
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=DTYPES[dtype])


PLAIN_OPS = (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Linear)


def platform_errors(model: torch.nn.Module, x: torch.Tensor, device: torch.device, dtype: str
                    ) -> List[str]:
    """The plain ops (convolutions, linear layers) that the device computes wrong in ``dtype``:
    each layer's output under autocast against float32 on the same inputs and weights rounded to
    ``dtype``, on the same device, off by more than the dtype's tolerance."""
    inputs: Dict[str, torch.Tensor] = {}
    hooks = [m.register_forward_pre_hook(
        lambda _, args, name=name: inputs.setdefault(name, args[0].detach()))
        for name, m in model.named_modules() if isinstance(m, PLAIN_OPS)]
    try:
        with torch.no_grad(), autocast(device, dtype):
            model(x)
    finally:
        for hook in hooks:
            hook.remove()
    low, wrong = DTYPES[dtype], []
    modules = dict(model.named_modules())
    for name, given in inputs.items():
        layer = modules[name]
        exact = copy.deepcopy(layer).float()
        for param in exact.parameters():
            param.data = param.data.to(low).float()
        with torch.no_grad():
            with autocast(device, dtype):
                got = layer(given)
            ref = exact(given.to(low).float())
        err = ((got.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-12)).item()
        if not err <= TOLERANCE[dtype]:
            wrong.append(f'{name} {layer} on {tuple(given.shape)} off by {err:.1e}')
    return wrong


def grads(model: torch.nn.Module, x: torch.Tensor, device: torch.device, dtype: str
          ) -> Dict[str, torch.Tensor]:
    model.zero_grad()
    with autocast(device, dtype):
        outs = model(x)
    sum(o.float().square().mean() for o in outs).backward()
    return {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


def check(name: str, device: torch.device, dtype: str) -> List[str]:
    """Problems found for one family (empty: all checks pass); prints its row."""
    torch.manual_seed(0)
    cfg = dict(type=f'mmvit_ext.{name}', **SMALL[name], drop_path_rate=0.0)
    ref = MODELS.build(cfg).eval()
    model = MODELS.build(cfg).to(device).eval()
    model.load_state_dict(ref.state_dict())
    x = torch.randn(2, 3, 72, 56)
    problems = []
    with torch.no_grad(), autocast(device, dtype):
        outs = model(x.to(device))
    with torch.no_grad():
        refs = ref(x)
    shapes_ok = [tuple(o.shape[1:]) for o in outs] == model.output_shapes(72, 56)
    if not shapes_ok:
        problems.append('output shapes differ from output_shapes()')
    err = max(((o.float().cpu() - r).abs().max() / r.abs().max()).item()
              for o, r in zip(outs, refs))
    if not err <= TOLERANCE[dtype]:
        platform = platform_errors(model, x.to(device), device, dtype) if dtype != 'fp32' else []
        problems.append(f'forward differs from CPU float32 by {err:.1e} (> {TOLERANCE[dtype]})'
                        + (f'; platform: the plain op is already wrong: {platform[0]}'
                           f'{f" (+{len(platform) - 1} more)" if len(platform) > 1 else ""}'
                           if platform else ''))
    model.train()
    plain = grads(model, x.to(device), device, dtype)
    finite = all(torch.isfinite(g).all() for g in plain.values())
    if not finite:
        problems.append('non-finite gradients')
    cp_err = 0.0
    if dtype == 'fp32':  # checkpointing must reproduce the plain run's gradients exactly
        blocks = [b for stage in model.checkpoint_stages() for b in stage]
        for setting in CP_SETTINGS:
            if setting == 'attn' and not all(hasattr(b, 'attn') for b in blocks):
                continue  # a convolutional family (ConvNeXt) has no attention part to select
            model.with_cp = setting
            got = grads(model, x.to(device), device, dtype)
            cp_err = max(cp_err, *(((got[k] - g).abs().max() / g.abs().max().clamp_min(1e-12))
                                   .item() for k, g in plain.items()))
        model.with_cp = False
        if not cp_err <= 1e-5:
            problems.append(f'with_cp gradients differ by {cp_err:.1e} (> 1e-5)')
    print(f'| {name} | {device.type} | {dtype} | {"yes" if shapes_ok else "NO"} | {err:.1e} | '
          f'{"yes" if finite else "NO"} | '
          f'{f"{cp_err:.1e}" if dtype == "fp32" else "-"} | {"; ".join(problems) or "ok"} |',
          flush=True)
    return problems


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    parser.add_argument('--dtype', choices=sorted(DTYPES), default='fp32')
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == 'cuda':  # float32 means float32 (TF32 would fail the 1e-4 check)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    print('| backbone | device | dtype | shapes | rel. error vs CPU fp32 | finite grads | '
          'with_cp grad rel. diff | result |\n|---|---|---|---|---|---|---|---|')
    names = sorted(cls.__name__ for cls in family_classes().values())
    results = {name: check(name, device, args.dtype) for name in names}
    platform = [n for n, found in results.items() if found and all('platform:' in p for p in found)]
    failed = [n for n, found in results.items() if found and n not in platform]
    limited = f'; limited by the platform (plain ops wrong): {platform}' if platform else ''
    print(f'CONTRACT {args.device} {args.dtype}: '
          + (f'FAILED for {failed}' if failed else f'{len(names) - len(platform)} families ok')
          + limited)
    sys.exit(1 if failed else 0)


if __name__ == '__main__':
    main()
