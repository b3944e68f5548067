"""Linear layers on CPU through oneDNN with prepacked weights.

torch's `F.linear` on CPU calls MKL's sgemm, which re-reads the weight in its row-major
layout on every call. oneDNN can keep the weight in its own blocked layout, packed once
at load, and its kernels then stream it about twice as fast for the few-row matmuls of a
batched decode step (8 rows x 512 -> 768, fp32, one thread: 135 against 229 us; bf16: 64
against 126 us) and still faster for a 1000-row prefill (7.3 against 8.3 ms); a lone row
is the exception (see PACKED_FOR_ROWS). vLLM's CPU backend packs its linear weights the
same way. The packed ops are the ones torch's own compiler uses when it freezes a CPU
model (`torch.ops.mkldnn._reorder_linear_weight` and `_linear_pointwise`); where this
torch build lacks them, the model is left as it was.

Results differ from `F.linear` by rounding only (sums taken in another order: about 1e-5
relative in fp32).
"""

from __future__ import annotations

import torch
from torch import nn

PACKED_FOR_ROWS = 8
"""oneDNN picks the packed layout for a number of rows, and one layout serves every batch. On a
2048 x 11008 weight (one thread), packed for 8 rows it is 2.9x faster than sgemm at 8 rows,
1.9x at 64 and 1.5x at 2, but 6-18% slower at 1 row (three measurements), where sgemm only
streams the weight; packed for 1 row it is 1.25x faster than sgemm at 1 row, and still 1.7x
at 64, but 1.35x slower than the 8-row layout at 8 rows. So a stage that never batches
(`max_num_seqs: 1`) packs for one row, any other for 8."""
MIN_PACKED_WEIGHT = {1: 1 << 18, PACKED_FOR_ROWS: 1 << 16}
"""Per packed layout (rows): the fewest weight elements worth packing. oneDNN costs about 12 us more
per call than sgemm, so below 512 x 512 (1 MiB in fp32) sgemm stays faster for one row. A batched
stage also prefills its prompts' hundreds to thousands of rows at a time, where packed is 2.3x
faster on a 512 -> 128 projection (a small model's keys or values; 2048 rows: 1.06 against 2.47 ms,
64 rows 1.8x) and 14% slower at 8 rows (20 against 18 us): such a stage packs from 128 x 512 up.
(One thread, fp32, AVX-512 host, medians of 31.)"""
MIN_PACKED_WEIGHT_TOKEN_ROWS = 0
"""The fewest weight elements worth packing where every call feeds hundreds to thousands of rows (a
diffusion transformer's tokens x batch): any. oneDNN's 12 us per call are lost in the matmul there, and
it is 1.6-2.3x faster from 32 -> 128 (576 rows: 31 against 50 us) to 512 -> 768 (128 rows); the few-row
calls such a model also makes (a block's modulation from the timestep embedding: 1-2 rows) lose 3-5 us
each on a small weight and gain on a large one (2 x 341 -> 2046: 45 against 88 us). The layout's row
hint is `PACKED_FOR_ROWS` there too: packed for 8, 256 or 1024 rows, the block matmuls of a request
to the zoo's small Z-Image, FLUX.1 and Qwen-Image (1 to 576 rows) took the same CPU time to 1%
(benchmarks/RESULTS.md, "Diffusion: prepacked linears on CPU"), and so did single ones of 128 to 4096 rows."""


def packable_dtypes() -> tuple[torch.dtype, ...]:
    """The weight dtypes this machine's oneDNN packs: fp32 wherever torch has the packed ops,
    bf16 only where the processor has bf16 instructions for it (AVX-512 BW/VL/DQ or AVX-NE-CONVERT:
    on an AVX2-only CPU the bf16 reorder raises), and none on a torch without them."""
    ops = torch.ops.mkldnn
    if not (torch.backends.mkldnn.is_available() and hasattr(ops, "_reorder_linear_weight")
            and hasattr(ops, "_linear_pointwise")):
        return ()
    bf16 = hasattr(ops, "_is_mkldnn_bf16_supported") and ops._is_mkldnn_bf16_supported()
    return (torch.float32, torch.bfloat16) if bf16 else (torch.float32,)


class PrepackedLinear(nn.Module):
    """`nn.Linear`'s forward over a weight packed once in oneDNN's layout (inference only)."""

    def __init__(self, linear: nn.Linear, rows: int = PACKED_FOR_ROWS) -> None:
        super().__init__()
        self.in_features, self.out_features, self.rows = linear.in_features, linear.out_features, rows
        weight = linear.weight.detach()
        self.register_buffer("packed_weight", torch.ops.mkldnn._reorder_linear_weight(weight, rows), persistent=False)
        # The bias is copied: a view of a checkpoint-backed tensor would keep the whole file's mapping
        # resident after sleep level 2 dropped every weight (30 MiB on the small qwen2).
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().clone(), persistent=False)

    @property
    def weight_shapes(self) -> dict[str, tuple[int, ...]]:
        """What it takes back from a checkpoint (`core.weights.load_weights`): the linear's weights, by name,
        with their shapes."""
        shapes = {"weight": (self.out_features, self.in_features)}
        return shapes if self.bias is None else {**shapes, "bias": (self.out_features,)}

    def load_weight(self, name: str, tensor: torch.Tensor) -> None:
        """New weights (an update): packed again, in the layout and dtype it had."""
        if name == "weight":
            weight = tensor.to(self.packed_weight.dtype)
            self.packed_weight = torch.ops.mkldnn._reorder_linear_weight(weight, self.rows)
        else:
            self.bias.copy_(tensor)

    def drop_weight(self, name: str) -> int:
        """Free the packed weight (sleep level 2; `load_weight` packs it again); the bias is kept."""
        if name != "weight":
            return 0
        dtype = self.packed_weight.dtype
        self.packed_weight = torch.empty(0, dtype=dtype)  # an opaque oneDNN tensor: no storage to count
        return self.in_features * self.out_features * torch.empty(0, dtype=dtype).element_size()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"packed for {self.rows} row(s)")


def prepack_linears(module: nn.Module, max_batch: int = PACKED_FOR_ROWS, min_weight: int | None = None) -> int:
    """Replace every plain `nn.Linear` under `module` that is on CPU, in a dtype this machine
    packs (`packable_dtypes`: fp32, and bf16 where the CPU supports it), and holds at least
    `min_weight` elements (default: `MIN_PACKED_WEIGHT` for its layout) by a `PrepackedLinear`;
    returns how many. `max_batch`: the most rows a step feeds the layers (an AR stage's
    `max_num_seqs`); 1 packs them for one row, more for `PACKED_FOR_ROWS`.
    A weight shared with another module (a tied LM head) gets its own packed copy, as in
    vLLM: that costs one more embedding-sized matrix of memory, for the largest matmul of
    a decode step."""
    dtypes = packable_dtypes()
    rows = 1 if max_batch == 1 else PACKED_FOR_ROWS
    min_weight = MIN_PACKED_WEIGHT[rows] if min_weight is None else min_weight
    swaps = [(parent, name) for parent in module.modules() for name, child in parent.named_children()
             if type(child) is nn.Linear and child.weight.device.type == "cpu"
             and child.weight.dtype in dtypes and child.weight.numel() >= min_weight]
    for parent, name in swaps:  # one layer at a time: the unpacked weight is freed as its copy lands
        setattr(parent, name, PrepackedLinear(getattr(parent, name), rows))
    return len(swaps)
