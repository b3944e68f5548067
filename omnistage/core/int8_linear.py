"""`int8_dynamic` on a CPU: a Linear layer as an int8 x int8 product through `torch._int_mm`.

The weight is rounded to int8 once at load, one scale per output channel; each call rounds its
input to int8, one scale per row (token), multiplies int8 by int8 into int32 with
`torch._int_mm` (oneDNN's int8 GEMM: AVX512-VNNI, or AMX, where the CPU has them) and scales
the product back by both. That is torchao's `Int8DynamicActivationInt8WeightConfig` rounding,
with its 31 eager ops per layer besides views (choosing and applying the scales through its
generic affine quantization, which cost it more than the product) cut to 12
(benchmarks/RESULTS.md, "Dynamic int8 DiT").

Other kernels measured for this (benchmarks/bench_quantization.py --layers): FBGEMM's
`quantized.linear_dynamic` is faster (one op), but rounds a whole call's input with one scale,
so a row of large values (in a batch, another request's) coarsens every row's rounding, and it
needs torch's deprecated quantized tensors; oneDNN's prepacked `onednn.qlinear_pointwise` also
takes one activation scale, and is slower than `torch._int_mm` at every size measured.

Where the CPU has no VNNI, `torch._int_mm` is slower than an fp32 matmul: correct, not fast (torchao's
layers over it ran a DiT step at 0.15x fp32 on an AVX2 CPU, RESULTS.md "Dynamic int8 DiT").
"""

from __future__ import annotations

import torch
from torch import nn

STEPS = 127.5
"""Symmetric rounding as torchao's: the largest |value| of a row is 127.5 steps, the rounded
values are clamped to int8's [-128, 127]."""
EPS = torch.finfo(torch.float32).eps


def round_to_int8(values: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """`values / scale` rounded to int8, computed as torchao does (times the reciprocal), so that
    values on a rounding boundary go the same way."""
    return (values * scale.reciprocal()).round_().clamp_(-128, 127).to(torch.int8)


class DynamicInt8Linear(nn.Module):
    """`nn.Linear`'s forward with an int8 weight and its input rounded to int8 per row (inference only)."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.dtype = linear.weight.dtype
        weight = linear.weight.detach().float()
        scale = (weight.abs().amax(dim=1) / STEPS).clamp_(min=EPS)
        self.register_buffer("qweight", round_to_int8(weight, scale[:, None]))
        # A parameter in the layer's dtype, as torchao's int8 weight is: some diffusers models read a
        # module's dtype from its first parameter (Wan's time embedder is two Linear layers).
        self.weight_scale = nn.Parameter(scale.to(self.dtype), requires_grad=False)
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().float().clone())

    @property
    def weight(self) -> torch.Tensor:
        """What models read of a Linear's weight besides its values (diffusers casts its inputs to
        `weight.dtype`): a NaN of the original dtype seen at the weight's shape, one element
        stored, so a model that did use its values would give NaN, not a plausible answer."""
        return torch.full((), float("nan"), dtype=self.dtype).expand(self.out_features, self.in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).float()
        scale = rows.abs().amax(dim=1, keepdim=True).div_(STEPS).clamp_(min=EPS)
        qrows = round_to_int8(rows, scale)
        # The int32 product times each row's scale (into a new fp32 tensor), then each channel's.
        out = (torch._int_mm(qrows, self.qweight.t()) * scale).mul_(self.weight_scale)
        if self.bias is not None:
            out.add_(self.bias)
        return out.reshape(*x.shape[:-1], self.out_features).to(x.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"
