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

Sibling linears that read the same input (a layer's q/k/v projections, its MLP's gate and
up) are packed as one matrix, as vLLM's QKVParallelLinear and MergedColumnParallelLinear
are: a step then makes 4 oneDNN calls per transformer layer rather than 7, each about
12 us of overhead (`FusedPrepackedLinear`). The layers keep their names, so transformers'
own forward, LoRA wrappers and weight updates by name see the same modules as before.
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


FUSED_SIBLINGS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
"""Children of one module that transformers' Llama-style layers (Qwen2, Qwen3, Llama, Mistral, ...)
call on the same input, one after the other: each group becomes one packed matmul."""


def pack_weight(weight: torch.Tensor, rows: int) -> torch.Tensor:
    """`weight` [out, in] in oneDNN's blocked layout for matmuls of about `rows` rows (opaque)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight, rows)


def packed_linear(x: torch.Tensor, packed_weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed_weight, bias, "none", [], "")


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
        self.register_buffer("packed_weight", pack_weight(weight, rows), persistent=False)
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
            self.packed_weight = pack_weight(weight, self.rows)
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
        return packed_linear(x, self.packed_weight, self.bias)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"packed for {self.rows} row(s)")


class FusedPrepackedLinear(nn.Module):
    """Sibling linears (`FUSED_SIBLINGS`) packed as one [sum of outs, in] matrix, computed by one
    oneDNN call. Each sibling's place holds a `PackedSlice` of it, which returns its columns.

    NOTE on the algorithm: the siblings are called one after the other on the same input tensor
    (transformers' `q_proj(h)`, `k_proj(h)`, `v_proj(h)`). The first call computes the whole
    output and keeps it with the input until each sibling took its columns (views, no copy); a
    call on another tensor, or a second call by a sibling already served, computes afresh. So a
    model that calls them otherwise (k and v on other states) gets the same values, only at
    the cost of a wider matmul."""

    def __init__(self, linears: list[nn.Linear], rows: int) -> None:
        super().__init__()
        self.in_features, self.rows = linears[0].in_features, rows
        self.sizes = [linear.out_features for linear in linears]
        self.out_features = sum(self.sizes)
        weight = torch.cat([linear.weight.detach() for linear in linears])
        self.register_buffer("packed_weight", pack_weight(weight, rows), persistent=False)
        has_bias = linears[0].bias is not None
        self.register_buffer("bias", torch.cat([linear.bias.detach() for linear in linears]) if has_bias else None,
                             persistent=False)
        self._staged: torch.Tensor | None = None
        """The dense weight while new weights come in by part (an update, or the read-back after sleep
        level 2); packed on the next call, when every part has come."""
        self._input: torch.Tensor | None = None
        self._outputs: tuple[torch.Tensor, ...] | None = None
        self._unserved: set[int] = set()

    def output(self, part: int, x: torch.Tensor) -> torch.Tensor:
        """Sibling `part`'s output for `x`: its columns of the fused output."""
        if x is not self._input or part not in self._unserved:
            if self._staged is not None:
                self.packed_weight, self._staged = pack_weight(self._staged, self.rows), None
            self._input = x
            self._outputs = packed_linear(x, self.packed_weight, self.bias).split(self.sizes, dim=-1)
            self._unserved = set(range(len(self.sizes)))
        out = self._outputs[part]
        self._unserved.discard(part)
        if not self._unserved:  # every sibling has its columns: hold no activation between layers
            self._input = self._outputs = None
        return out

    def load_part(self, part: int, name: str, tensor: torch.Tensor) -> None:
        start = sum(self.sizes[:part])
        rows = slice(start, start + self.sizes[part])
        if name == "bias":
            self.bias[rows].copy_(tensor)
            return
        if self._staged is None:
            dtype = self.packed_weight.dtype
            self._staged = (self.packed_weight.to_dense() if self.packed_weight.is_mkldnn
                            else torch.zeros(self.out_features, self.in_features, dtype=dtype))  # dropped
        self._staged[rows].copy_(tensor)
        self._input = self._outputs = None

    def drop(self) -> int:
        """Free the packed weight (sleep level 2; `load_part` of every part rebuilds it); bytes freed."""
        if not self.packed_weight.is_mkldnn:
            return 0  # a sibling dropped it already
        dtype = self.packed_weight.dtype
        self.packed_weight, self._staged = torch.empty(0, dtype=dtype), None
        self._input = self._outputs = None
        return self.in_features * self.out_features * torch.empty(0, dtype=dtype).element_size()

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={'+'.join(map(str, self.sizes))}, "
                f"bias={self.bias is not None}, packed for {self.rows} row(s)")


class PackedSlice(nn.Module):
    """One sibling of a `FusedPrepackedLinear` in its linear's place: it computes like that linear,
    and takes and frees that linear's weights by name (`core.weights`)."""

    def __init__(self, fused: FusedPrepackedLinear, part: int) -> None:
        super().__init__()
        self.fused, self.part = fused, part
        self.in_features, self.out_features = fused.in_features, fused.sizes[part]

    @property
    def weight_shapes(self) -> dict[str, tuple[int, ...]]:
        shapes = {"weight": (self.out_features, self.in_features)}
        return shapes if self.fused.bias is None else {**shapes, "bias": (self.out_features,)}

    def load_weight(self, name: str, tensor: torch.Tensor) -> None:
        self.fused.load_part(self.part, name, tensor)

    def drop_weight(self, name: str) -> int:
        return self.fused.drop() if name == "weight" else 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fused.output(self.part, x)

    def extra_repr(self) -> str:
        return f"part {self.part} of the fused linear: out_features={self.out_features}"


def prepack_linears(module: nn.Module, max_batch: int = PACKED_FOR_ROWS, fuse: bool = False,
                    min_weight: int | None = None) -> int:
    """Replace every plain `nn.Linear` under `module` that is on CPU, in a dtype this machine
    packs (`packable_dtypes`: fp32, and bf16 where the CPU supports it), and holds at least
    `min_weight` elements (default: `MIN_PACKED_WEIGHT` for its layout) by a `PrepackedLinear`;
    returns how many. `max_batch`: the most rows a step feeds the layers (an AR stage's
    `max_num_seqs`); 1 packs them for one row, more for `PACKED_FOR_ROWS`.
    `fuse`: each group of `FUSED_SIBLINGS` that are all such linears, of one input size, dtype
    and bias presence, becomes one `FusedPrepackedLinear` (the threshold counts the group's
    elements), its members `PackedSlice`s of it.
    A weight shared with another module (a tied LM head) gets its own packed copy, as in
    vLLM: that costs one more embedding-sized matrix of memory, for the largest matmul of
    a decode step."""
    dtypes = packable_dtypes()
    rows = 1 if max_batch == 1 else PACKED_FOR_ROWS
    min_weight = MIN_PACKED_WEIGHT[rows] if min_weight is None else min_weight

    def packable(child: nn.Module) -> bool:
        return type(child) is nn.Linear and child.weight.device.type == "cpu" and child.weight.dtype in dtypes

    groups, singles = [], []
    for parent in module.modules():
        children = dict(parent.named_children())
        fused: set[str] = set()
        for names in FUSED_SIBLINGS if fuse else ():
            linears = [children.get(name) for name in names]
            if (all(child is not None and packable(child) for child in linears)
                    and len({(c.in_features, c.weight.dtype, c.bias is None) for c in linears}) == 1
                    and sum(c.weight.numel() for c in linears) >= min_weight):
                groups.append((parent, names))
                fused.update(names)
        singles += [(parent, name) for name, child in children.items() if name not in fused and packable(child)
                    and child.weight.numel() >= min_weight]
    for parent, names in groups:  # one group at a time: the unpacked weights are freed as their copy lands
        fused_linear = FusedPrepackedLinear([getattr(parent, name) for name in names], rows)
        for part, name in enumerate(names):
            setattr(parent, name, PackedSlice(fused_linear, part))
    for parent, name in singles:
        setattr(parent, name, PrepackedLinear(getattr(parent, name), rows))
    return sum(len(names) for _, names in groups) + len(singles)
