"""`compile: true` on an AR stage: the decode forward at static shapes, replayed from CUDA graphs.

A decode step's eager forward is a few hundred small kernels whose launch cost, not their
math, is most of a small model's step on a GPU. A `torch.cuda.CUDAGraph` records them
once and replays them with one launch, but only over fixed shapes and fixed memory. So
`StaticDecode` owns preallocated buffers for everything a decode forward reads:

- input ids, positions and write slots, `[3, max_batch]` (one token per row);
- read slots `[b * kv_len]` (the slot of each key each row attends to, position order) and
  the attention mask `[b, 1, 1, kv_len]`, flat buffers viewed at each shape;
- or, where attention reads the KV blocks in place (paged_attention.py, the cache built
  `in_place`), a `PagedLayout` instead of the mask: each row's block table `[b, kv_len /
  block_size]` (int32, in the read buffer), its key count (position + 1) and its start in the
  flattened step (one token per row: fixed), with the tokens packed `[1, b]`;

and fills them in place before each step. A step of `n` decodes runs at the smallest
captured batch size `b >= n` (`batch_sizes`: 1, 2, 4, 8, ... up to `max_num_seqs`, and
`max_num_seqs` itself) and the smallest key length `kv_len >= its longest context`
(`kv_lens`: 256 tokens doubling up to `max_model_len` in whole blocks). The `b - n`
padding rows feed token 0 at position 0, write to the scratch block's slot 0 and read
it; their logits are never sampled. Keys past a row's context read the scratch block
and are masked.

Cost of the static shapes: a step gathers and attends over 256 keys (in place: reads only its
rows' own blocks), or up to twice the
keys of its longest row (the key-length bucket), for up to twice its rows (the batch
bucket); padding is the price of one launch per step. With graphs the KV pools are
allocated at their whole `kv_cache_memory` budget at start-up (eager decoding grows them
as blocks are used), since a graph holds their addresses; and one graph per (batch size,
key length) pair is captured at start-up, largest first, in one shared memory pool, so
they cost the largest one's activations, not the sum. Shapes above `MAX_GRAPH_KEYS`
(batch size x key length) are neither captured nor run static: those steps run eagerly.

`capture=False` runs the same static path eagerly (fill the buffers, call the model's
forward on them): what the CPU tests check token for token against the eager engine,
and what a captured graph replays. Steps that do not fit stay eager in the runner:
prefills and mixed steps, and decodes that want hidden states or input embeddings
(the graphs are captured without them).

A family opts in with `ARModel.supports_cuda_graphs`; its forward must then read only the
tensors of `ModelInput` (never `seqs`, `query_lens`, `context_lens` or `seq.model_state`,
which a graph would freeze at capture time) and must not synchronize with the host.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from omnistage.ar.kv_cache import PagedKVCache
from omnistage.ar.model import ARModel, ModelInput, ModelOutput
from omnistage.ar.paged_attention import PagedLayout
from omnistage.ar.scheduler import ScheduledSeq
from omnistage.ar.staging import to_device

SMALLEST_KV_LEN = 256
"""Shortest key-length bucket in tokens: attending to 256 padded keys costs a GPU next to
nothing, and fewer buckets mean fewer graphs to capture."""

MAX_GRAPH_KEYS = 1 << 18
"""Largest batch size x key length captured. Each layer gathers that many keys and values
(SDPA over gathered blocks), and the graphs' shared pool keeps the largest shape's
activations for the engine's life: 2^18 keys of a 7B-class model (8 KV heads x 128, bf16)
are 0.5 GiB each of keys and values. Bigger steps (long contexts at large batches) run
eagerly, where that memory is only held while they run."""


def batch_sizes(max_num_seqs: int) -> tuple[int, ...]:
    """1, 2, 4, ... below `max_num_seqs`, then `max_num_seqs`: at most 2x padded rows."""
    sizes, b = [], 1
    while b < max_num_seqs:
        sizes.append(b)
        b *= 2
    return (*sizes, max_num_seqs)


def kv_lens(max_model_len: int, block_size: int) -> tuple[int, ...]:
    """Key-length buckets: whole blocks, SMALLEST_KV_LEN doubling, capped by max_model_len's blocks."""
    longest = -(-max_model_len // block_size) * block_size
    smallest = -(-SMALLEST_KV_LEN // block_size) * block_size
    lens, k = [], smallest
    while k < longest:
        lens.append(k)
        k *= 2
    return (*lens, longest)


Recorder = Callable[[Callable[[], ModelOutput]], tuple[Callable[[], None], ModelOutput]]
"""`record(forward) -> (replay, output)`: capture a forward once; `replay()` reruns it into `output`."""


@dataclass
class _Graph:
    replay: Callable[[], None]
    output: ModelOutput
    """The captured forward's output: each replay overwrites these tensors in place."""


class CudaGraphRecorder:
    """`record(forward) -> (replay, output)`: capture `forward` in a `torch.cuda.CUDAGraph`; all
    graphs of one recorder share one memory pool (only one replays at a time)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.pool = torch.cuda.graph_pool_handle()
        with torch.cuda.device(device):
            self.warmup = torch.cuda.Stream()  # one side stream for every graph's warm-up run

    def __call__(self, forward: Callable[[], ModelOutput]) -> tuple[Callable[[], None], ModelOutput]:
        # The capture stream belongs to the current device: make it the model's (cuda:1 too).
        with torch.cuda.device(self.device):
            # one eager run on a side stream first, as torch's docs ask: lazy initialization and
            # library workspaces happen outside the capture
            self.warmup.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(self.warmup):
                forward()
            torch.cuda.current_stream().wait_stream(self.warmup)
            graph = torch.cuda.CUDAGraph()
            # thread_local: another stage of this process (an inline stage stepping, a restart)
            # may allocate on its own thread meanwhile; "global" would fail its calls
            with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
                output = forward()
        return graph.replay, output  # CUDAGraph.replay runs on its own device


class StaticDecode:
    """Static buffers, `capture()` and `run()` for decode-only steps (see module docstring)."""

    def __init__(self, model: ARModel, cache: PagedKVCache, block_size: int, max_num_seqs: int,
                 max_model_len: int, device: torch.device, *, capture: bool,
                 max_graph_keys: int = MAX_GRAPH_KEYS) -> None:
        if not model.supports_cuda_graphs:
            raise ValueError(f"{type(model).__name__} cannot run its decode step at static shapes "
                             "(ARModel.supports_cuda_graphs is False)")
        if capture and torch.device(device).type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, not {device}")
        self.model = model
        self.cache = cache
        self.in_place = cache.in_place
        """Attention reads the KV blocks in place: the forward gets a `PagedLayout`, not a mask."""
        self.block_size = block_size
        self.device = device
        self.batch_sizes = batch_sizes(max_num_seqs)
        self.kv_lens = kv_lens(max_model_len, block_size)
        self.shapes = {(b, k) for b in self.batch_sizes for k in self.kv_lens if b * k <= max_graph_keys}
        """The (batch size, key length) pairs that run static (and are captured), at most
        `max_graph_keys` keys each."""
        if not self.shapes:
            raise ValueError(f"max_graph_keys={max_graph_keys} is below one row of {self.kv_lens[0]} keys")
        keys = max(b * k for b, k in self.shapes)
        self.meta = torch.zeros(3, self.batch_sizes[-1], dtype=torch.long, device=device)  # ids, positions, writes
        # block ids, per row (int32 where they are the kernel's block tables)
        self.read = torch.zeros(keys // block_size, dtype=torch.int32 if self.in_place else torch.long, device=device)
        self.mask = torch.zeros(keys, dtype=torch.bool, device=device)
        # in place: row r's one token is flattened position r, and it sees its position + 1 keys
        self.rows = torch.arange(self.batch_sizes[-1] + 1, device=device)
        self.query_starts = self.rows.to(torch.int32)
        self.context_lens = torch.zeros(self.batch_sizes[-1], dtype=torch.int32, device=device)
        self.arange = torch.arange(self.kv_lens[-1], device=device)
        self.graphs: dict[tuple[int, int], _Graph] = {}
        self.num_replays = 0
        """Decode steps run from a captured graph (the GPU test checks graphs really ran)."""
        self.steps_by_shape: dict[tuple[int, int], int] = {}
        """(padded batch size, key length) -> decode steps run at it, captured or not."""
        if capture:
            self.capture()

    # --- which steps fit --------------------------------------------------------------------

    def fits(self, items: list[ScheduledSeq]) -> bool:
        """Can this decode-only step run at static shapes? (Else the runner's eager path runs it.)"""
        if not items or len(items) > self.batch_sizes[-1]:
            return False
        # one token each, the sequence's last (what the buffers hold), and no per-row states out
        if not all(it.num_new == 1 and it.samples and not (it.seq.return_hidden_states or it.seq.return_input_embeds)
                   for it in items):
            return False
        return self.shape_for(items) in self.shapes

    def shape_for(self, items: list[ScheduledSeq]) -> tuple[int, int]:
        """(padded batch size, key length) of a step: the smallest buckets that hold it."""
        n, context = len(items), max(it.start for it in items) + 1
        return (next(b for b in self.batch_sizes if b >= n), next(k for k in self.kv_lens if k >= context))

    # --- the static inputs ------------------------------------------------------------------

    def _inputs(self, b: int, k: int) -> ModelInput:
        """The model's input over views of the static buffers at shape (b, k); no sequences: a
        capturable forward reads only these tensors."""
        if self.in_place:
            width = k // self.block_size
            layout = PagedLayout(self.read[:b * width].view(b, width), self.query_starts[:b + 1], self.context_lens[:b])
            return ModelInput(
                input_ids=self.meta[0, :b].view(1, b), positions=self.meta[1, :b].view(1, b), attention_mask=layout,
                last_indices=self.rows[:b], query_lens=[1] * b, kv_len=k, seqs=[], is_prefill=False, packed=True,
            )
        return ModelInput(
            input_ids=self.meta[0, :b].view(b, 1), positions=self.meta[1, :b].view(b, 1),
            attention_mask=self.mask[:b * k].view(b, 1, 1, k), last_indices=None,
            query_lens=[1] * b, kv_len=k, seqs=[], is_prefill=False,
        )

    def _fill(self, items: list[ScheduledSeq], b: int, k: int) -> None:
        """Write this step's rows into the buffers in place; rows n..b-1 are padding."""
        size, width, pad = self.block_size, k // self.block_size, b - len(items)
        seqs = [it.seq for it in items]
        starts = [it.start for it in items]
        writes = [seq.block_table[p // size] * size + p % size for seq, p in zip(seqs, starts)]
        meta = [row + [0] * pad for row in ([seq.last_token_id for seq in seqs], starts, writes)]
        tables = [seq.block_table[:width] + [0] * (width - min(width, len(seq.block_table))) for seq in seqs]
        tables += [[0] * width] * pad  # padding rows: the scratch block
        meta_t, table = to_device([[i for row in meta for i in row], [i for row in tables for i in row]], self.device)
        self.meta[:, :b].copy_(meta_t.view(3, b))
        self.read[:b * width].view(b, width).copy_(table.view(b, width))
        # a row attends to keys 0 .. its position (a padding row: key 0 only, so no row is all-masked)
        if self.in_place:
            self.context_lens[:b].copy_(self.meta[1, :b]).add_(1)
        else:
            torch.le(self.arange[:k], self.meta[1, :b, None], out=self.mask[:b * k].view(b, k))

    def _begin(self, b: int, k: int, num_blocks: int) -> None:
        read = None if self.in_place else self.read[:b * k // self.block_size]
        self.cache.begin(num_blocks, self.meta[2, :b], read, k, in_place=self.in_place)

    # --- capture and run --------------------------------------------------------------------

    @torch.inference_mode()
    def capture(self, record: Recorder | None = None) -> None:
        """Record one graph per shape (batch size, key length), largest first (`record`: a
        `CudaGraphRecorder`; the CPU tests pass one that re-runs the forward eagerly, to check
        that replays read the buffers filled in place). The KV pools are first allocated at
        the whole budget: a graph holds their addresses, so they must never be reallocated."""
        record = record or CudaGraphRecorder(self.device)
        full = self.cache.max_num_blocks
        # the pools' first (lazy) allocation, on the main stream where every later step uses them
        self._fill([], 1, self.kv_lens[0])
        self._begin(1, self.kv_lens[0], full)
        self.model.forward(self._inputs(1, self.kv_lens[0]), self.cache)
        for b, k in sorted(self.shapes, key=lambda shape: (shape[0] * shape[1], shape), reverse=True):
            self._fill([], b, k)  # padding rows only: the capture writes nothing but the scratch block
            inp = self._inputs(b, k)

            def forward(b=b, k=k, inp=inp) -> ModelOutput:
                self._begin(b, k, full)
                return self.model.forward(inp, self.cache)

            self.graphs[b, k] = _Graph(*record(forward))

    def run(self, items: list[ScheduledSeq], num_blocks: int) -> tuple[ModelInput, ModelOutput]:
        """One decode-only step at static shapes: the model input and output of the real rows
        (`n` of them, padding sliced off), for the runner's sampling."""
        b, k = self.shape_for(items)
        self._fill(items, b, k)
        entry = self.graphs.get((b, k))
        if entry is not None:
            entry.replay()
            out = entry.output
            self.num_replays += 1
        else:
            self._begin(b, k, num_blocks)
            out = self.model.forward(self._inputs(b, k), self.cache)
        self.steps_by_shape[b, k] = self.steps_by_shape.get((b, k), 0) + 1
        n = len(items)
        full = self._inputs(b, k)
        if self.in_place:  # packed [1, b]: the first n tokens, and the layout's first n rows
            layout = full.attention_mask
            real = dict(input_ids=full.input_ids[:, :n], positions=full.positions[:, :n], last_indices=self.rows[:n],
                        attention_mask=PagedLayout(layout.block_tables[:n], layout.query_starts[:n + 1],
                                                   layout.context_lens[:n]))
        else:
            real = dict(input_ids=full.input_ids[:n], positions=full.positions[:n],
                        attention_mask=full.attention_mask[:n])
        inp = replace(full, **real, seqs=[it.seq for it in items], query_lens=[1] * n,
                      context_lens=[it.start for it in items])
        return inp, ModelOutput(logits=out.logits[:n])
