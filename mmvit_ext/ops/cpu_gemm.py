"""Float32 CPU GEMMs through oneDNN.

``F.linear`` on CPU calls MKL's sgemm, which picks its code path by CPU vendor: on AMD EPYC it
runs AVX2 kernels even where the core has AVX-512. A 1x1 convolution over a channels-last view
of the same tokens runs oneDNN's JIT kernels for the ISA the CPU reports, forward and backward
(autograd differentiates the convolution; measured on a 2-core EPYC with AVX-512: fwd+bwd
1.5-2.9x faster for 2k-32k tokens). Same product up to float32 summation order.
"""
import torch
import torch.nn.functional as F

# Below this many rows the convolution's set-up costs more than MKL's AVX2 loses (measured).
ONEDNN_MIN_ROWS = 256


def applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Large float32 CPU inputs outside autocast."""
    return (x.dtype == torch.float32 and weight.dtype == torch.float32 and x.dim() >= 2
            and x.device.type == 'cpu' and x.numel() >= ONEDNN_MIN_ROWS * x.shape[-1]
            and not torch.is_autocast_enabled('cpu') and torch.backends.mkldnn.is_available())


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor = None):
    """``F.linear`` as a 1x1 convolution, or ``NotImplemented`` where :func:`applies` says no."""
    if not applies(x, weight):
        return NotImplemented
    out_features, in_features = weight.shape
    rows = x.numel() // in_features
    # (rows, K) row-major is a channels-last (1, K, rows, 1) image: no copy on the way in or out.
    image = x.reshape(1, rows, 1, in_features).permute(0, 3, 1, 2)
    out = F.conv2d(image, weight.view(out_features, in_features, 1, 1), bias)
    return out.permute(0, 2, 3, 1).reshape(*x.shape[:-1], out_features)
