"""Turns a `ARSchedulerOutput` into tensors, runs the model, samples one token per caught-up row.

The only torch-facing part of the AR engine besides the model and the cache. A step is
one or two forwards:

- a model that `supports_packed_batch` runs a step with prompt chunks beside decodes or
  other chunks as ONE packed forward (every row's tokens end to end, `[1, N]`, as vLLM's
  flattened batch; attention per row, packed_attention.py): a newcomer's prefill costs
  the running streams one forward, not two, and ragged prompts pay for no padding. A
  decode-only step, or one prompt alone, is the padded layout (it has no padding), except
  a lone chunk after fewer cached keys than its own length, which attends faster packed;
- otherwise its decodes (`[B, 1]`) and its prompt chunks (`[B, T]`, padded) are two
  forwards: families with their own forward keep their two code paths (prefill reads
  prompt embeddings, decode the last token).

With `compile: true` (CUDA) a decode-only step instead runs at static shapes, replayed
from a CUDA graph (cuda_graphs.py, `enable_static_decode`). The per-step work outside the
forwards is a handful of small tensors built from Python lists, staged in one host-to-device
copy (staging.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from omnistage.ar.block_states import BlockStates
from omnistage.ar.cuda_graphs import StaticDecode
from omnistage.ar.kv_cache import PagedKVCache
from omnistage.ar.lora import AdapterTable
from omnistage.ar.model import ARModel, ModelInput, ModelOutput
from omnistage.ar.packed_attention import PackedAttention, PromptRow
from omnistage.ar.paged_attention import PagedLayout
from omnistage.ar.sampler import Sampler
from omnistage.ar.scheduler import ScheduledSeq, ARSchedulerOutput
from omnistage.ar.sequence import Sequence
from omnistage.ar.staging import to_device


@dataclass
class ARRunnerOutput:
    token_ids: dict[str, int]
    """request id -> the token sampled for it (sequences whose prompt is still mid-way have none)."""
    extras: dict[str, dict[str, Any]]
    """request id -> this step's `TextPayload.extras` from the model."""
    logprobs: dict[str, Any] = field(default_factory=dict)
    """request id -> the sampler's logprobs of its token, when it asked for them."""


class _StateRows:
    """A sequence's hidden states / input embeddings, one row per fed position, in a buffer
    sized for the whole request: outputs are views of it, nothing is re-concatenated."""

    def __init__(self, capacity: int, width: int, like: torch.Tensor) -> None:
        self.buf = like.new_empty(capacity, width)
        self.n = 0  # rows held: positions 0 .. n-1
        self.sent = 0  # rows already in an output's delta

    def put(self, start: int, rows: torch.Tensor) -> None:
        """The rows of positions start.. ; those held already are kept (a recompute after a
        preemption feeds them again: what was sent stays what the request returns)."""
        skip = self.n - start
        if skip < rows.shape[0]:
            self.buf[self.n:start + rows.shape[0]] = rows[max(skip, 0):]
            self.n = start + rows.shape[0]

    def view(self, start: int = 0) -> torch.Tensor:
        return self.buf[start:self.n]

    def take_delta(self) -> torch.Tensor:
        """The rows added since the last call (a chunked prompt's rows come out with its first token)."""
        delta, self.sent = self.view(self.sent), self.n
        return delta


class ModelRunner:
    def __init__(self, model: ARModel, block_size: int, max_num_blocks: int, max_model_len: int,
                 device: torch.device, in_place: bool = False, keep_block_states: bool = False) -> None:
        self.model = model
        self.device = device
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.max_num_blocks = max_num_blocks
        self.in_place = in_place
        """Attention reads the KV blocks in place (paged_attention.py) in every step that reads cached keys."""
        self.cache = PagedKVCache(model.num_layers, block_size, max_num_blocks, in_place)
        self.sampler = Sampler(device)
        self._arange = torch.arange(max(max_model_len, block_size) + 1, device=device)
        self.hidden: dict[str, _StateRows] = {}
        self.embeds: dict[str, _StateRows] = {}
        self.keep_block_states = keep_block_states
        """Store a prefix-cacheable request's rows beside its KV blocks, and give a prefix-cache hit
        the rows of its cached positions from there (block_states.py)."""
        self.block_states = {kind: BlockStates(block_size, max_num_blocks) for kind in ("hidden_states", "input_embeds")}
        self.static_decode: StaticDecode | None = None  # compile: true (cuda_graphs.py)
        self.adapters: AdapterTable | None = None
        """The LoRA adapters rows may use (lora.py), told each forward's rows; None: the stage serves none."""

    def enable_static_decode(self, max_num_seqs: int, *, capture: bool) -> None:
        """Run decode-only steps at static shapes, replayed from CUDA graphs when `capture`."""
        self.static_decode = StaticDecode(self.model, self.cache, self.block_size, max_num_seqs,
                                          self.max_model_len, self.device, capture=capture)

    @torch.inference_mode()
    def execute(self, batch: ARSchedulerOutput, num_blocks: int) -> ARRunnerOutput:
        """Run the step (one packed forward, or its decodes, then its prefills); `num_blocks`: the largest
        block id in use + 1. Returns the sampled token of every sequence the step caught up."""
        out = ARRunnerOutput({}, {})
        if self.static_decode is not None and not batch.prefills and self.static_decode.fits(batch.decodes):
            inp, output = self.static_decode.run(batch.decodes, num_blocks)  # static shapes, a CUDA graph
            self._run_group(batch.decodes, inp, out, output)
            return out
        if self.in_place and (batch.decodes or len(batch.prefills) > 1 or batch.prefills[0].start):
            inp = self._prepare_in_place(batch.decodes, batch.prefills, num_blocks)
            self._run_group(batch.decodes + batch.prefills, inp, out)
            return out
        if self.model.supports_packed_batch and batch.prefills and (batch.decodes or len(batch.prefills) > 1
                                                                    or _after_fewer_cached_keys(batch.prefills[0])):
            inp = self._prepare_packed(batch.decodes, batch.prefills, num_blocks)
            self._run_group(batch.decodes + batch.prefills, inp, out)
            return out
        for items, is_prefill in ((batch.decodes, False), (batch.prefills, True)):
            if items:
                self._run_group(items, self._prepare(items, is_prefill, num_blocks), out)
        return out

    def _run_group(self, items: list[ScheduledSeq], inp: ModelInput, result: ARRunnerOutput,
                   output: ModelOutput | None = None) -> None:
        """Run `inp` (unless `output` is given: its forward already ran), sample, keep states."""
        out = output if output is not None else self._forward(inp)
        rows = [i for i, item in enumerate(items) if item.samples]
        if rows:
            if len(rows) == len(items):
                tokens = self.sampler(out.logits, inp.seqs)
                row_extras = self.model.on_sampled(inp, out, tokens)
            else:  # some prompts are mid-way (chunked): only the caught-up rows sample
                tokens = self.sampler(out.logits[rows], [inp.seqs[i] for i in rows])
                row_extras = [out.extras[i] for i in rows] if out.extras else None
            logprobs = self.sampler.last_logprobs  # per row of that call, when one asked
            for j, (i, token) in enumerate(zip(rows, tokens.tolist())):
                rid = items[i].seq.request_id
                result.token_ids[rid] = token
                if row_extras:
                    result.extras[rid] = row_extras[j]
                if logprobs is not None and logprobs[j] is not None:
                    result.logprobs[rid] = logprobs[j]
        if out.hidden_states is not None:
            self._keep(self.hidden, items, inp, out.hidden_states, "hidden_states")
        if out.input_embeds is not None:
            self._keep(self.embeds, items, inp, out.input_embeds, "input_embeds")

    def _forward(self, inp: ModelInput) -> ModelOutput:
        if self.adapters is None:
            return self.model.forward(inp, self.cache)
        self.adapters.begin(inp)  # which rows use which LoRA adapter
        try:
            return self.model.forward(inp, self.cache)
        finally:
            self.adapters.end()

    # --- inputs ------------------------------------------------------------------------------

    def _prepare(self, items: list[ScheduledSeq], is_prefill: bool, num_blocks: int) -> ModelInput:
        """Padded `[B, T]` ids and positions, each row's KV slots, and the attention mask.

        Row i feeds positions start_i .. start_i + n_i - 1 and attends to keys 0 .. its own
        position (causal) of its `start_i + n_i` in the cache: all but the padding. The cache
        reads each row's first `width` blocks (a prefill from position 0 reads none: it attends
        to its fresh keys).
        """
        seqs = [item.seq for item in items]
        starts = [item.start for item in items]
        lens = [item.num_new for item in items]
        b, t = len(items), max(lens)
        kv_len = max(s + n for s, n in zip(starts, lens))
        dev, size = self.device, self.block_size
        width = -(-kv_len // size)
        tables = [seq.block_table[:width] + [0] * (width - len(seq.block_table)) for seq in seqs]
        if is_prefill:
            fed = [seq.all_token_ids[s:s + n] + [0] * (t - n) for seq, s, n in zip(seqs, starts, lens)]
            table_t, ids, start_t, len_t = to_device([[i for row in tables for i in row], [i for row in fed for i in row],
                                                      starts, lens], dev)
        else:
            writes = [seq.block_table[p // size] * size + p % size for seq, p in zip(seqs, starts)]
            table_t, ids, start_t, write = to_device([[i for row in tables for i in row],
                                                      [seq.last_token_id for seq in seqs], starts, writes], dev)
        table_t = table_t.view(b, width)
        # every slot of each row's blocks in position order (past a row's blocks: the scratch block)
        slots = (table_t[:, :, None] * size + self._arange[:size]).view(b, width * size)
        keys = self._arange[:kv_len]
        read = table_t.flatten() if not is_prefill or any(starts) else None
        if is_prefill:
            ids = ids.view(b, t)
            positions = start_t[:, None] + self._arange[:t]  # [B, T]
            is_fed = self._arange[:t] < len_t[:, None]
            write = torch.where(is_fed, slots.gather(1, positions.clamp(max=kv_len - 1)), 0).flatten()  # padding -> scratch
            ctx = (start_t + len_t)[:, None, None]
            # causal, and keys past the row's context are padding
            mask = (keys <= positions[:, :, None]) & (keys < ctx)
            last = len_t - 1
        else:
            ids, positions = ids.view(b, 1), start_t.view(b, 1)
            mask = (keys <= positions).view(b, 1, kv_len)  # keys after a row's position are padding
            last = None
        self.cache.begin(num_blocks, write, read, kv_len)
        want_hidden, want_embeds = _wants(seqs)
        return ModelInput(
            input_ids=ids, positions=positions, attention_mask=mask[:, None],
            last_indices=last, query_lens=lens, kv_len=kv_len, seqs=seqs,
            is_prefill=is_prefill, output_hidden_states=want_hidden, output_input_embeds=want_embeds,
            context_lens=starts,
        )

    def _prepare_packed(self, decodes: list[ScheduledSeq], prompts: list[ScheduledSeq],
                        num_blocks: int) -> ModelInput:
        """The packed layout of packed_attention.py: decode tokens, then prompt chunks; decode
        contexts padded to the longest, then each prompt row's context, all in whole blocks."""
        dev, size = self.device, self.block_size
        items = decodes + prompts
        width = -(-max(item.start + item.num_new for item in items) // size)
        d = len(decodes)
        # past a row's blocks: the scratch block
        tables = [i for item in items for i in item.seq.block_table[:width] + [0] * (width - len(item.seq.block_table))]
        fed = [item.seq.last_token_id for item in decodes]
        last = list(range(d))
        for item in prompts:
            fed += item.seq.all_token_ids[item.start:item.start + item.num_new]
            last.append(len(fed) - 1)
        blocks, positions, last, input_ids = to_device([tables, [item.start for item in decodes], last, fed], dev)
        blocks = blocks.view(len(items), width)
        slots = (blocks[:, :, None] * size + self._arange[:size]).view(len(items), width * size)
        decode_blocks = -(-max((item.start + 1 for item in decodes), default=0) // size)
        m = decode_blocks * size
        write, read = [slots[:d].gather(1, positions[:, None])[:, 0]], [blocks[:d, :decode_blocks].reshape(-1)]
        rows, first_token, first_key = [], d, d * m
        for i, item in enumerate(prompts, start=d):
            start, n = item.start, item.num_new
            ctx = start + n
            row_blocks = -(-ctx // size)
            mask = None  # causal; after fewer cached keys than the chunk has, as the causal square's last rows
            if start >= n:  # many cached keys before a short chunk: causal from `start`, masked
                mask = (self._arange[None, :row_blocks * size] <= self._arange[start:ctx, None])[None, None]
            rows.append(PromptRow(first_token, start, n, first_key, row_blocks * size, mask))
            write.append(slots[i, start:ctx])
            read.append(blocks[i, :row_blocks])
            first_token, first_key = first_token + n, first_key + row_blocks * size
        keys = self._arange[:m]
        layout = PackedAttention(d, m, positions, (keys <= positions[:, None]).view(d, 1, 1, m) if d else None, rows)
        token_positions = torch.cat([positions] + [self._arange[r.start:r.start + r.num_tokens] for r in rows])
        self.cache.begin(num_blocks, torch.cat(write), torch.cat(read), first_key)
        seqs = [item.seq for item in items]
        lens = [item.num_new for item in items]
        want_hidden, want_embeds = _wants(seqs)
        return ModelInput(
            input_ids=input_ids[None],
            positions=token_positions[None], attention_mask=layout, last_indices=last,
            query_lens=lens, kv_len=first_key, seqs=seqs, is_prefill=True,
            output_hidden_states=want_hidden, output_input_embeds=want_embeds,
            context_lens=[item.start for item in items], packed=True,
        )

    def _prepare_in_place(self, decodes: list[ScheduledSeq], prompts: list[ScheduledSeq],
                          num_blocks: int) -> ModelInput:
        """Every row's tokens end to end (`[1, N]`, as `_prepare_packed`), the attention mask a
        `PagedLayout`: each row's block table, where its tokens start in N, its keys after this
        forward. The kernel reads the blocks where they are, so nothing is padded or gathered."""
        dev, size = self.device, self.block_size
        items = decodes + prompts
        width = -(-max(item.start + item.num_new for item in items) // size)
        tables, fed, positions, write, starts, ends = [], [], [], [], [0], []
        for i, item in enumerate(items):
            seq, start, n = item.seq, item.start, item.num_new
            table = seq.block_table
            tables += table[:width] + [0] * (width - len(table))  # past its blocks: scratch
            fed += [seq.last_token_id] if i < len(decodes) else seq.all_token_ids[start:start + n]
            positions += range(start, start + n)
            # each token's slot, here with the positions (a list op per token) rather than as ~6 tensor
            # ops per step: a decode step's few tokens would pay each op's fixed cost
            write += [table[p // size] * size + p % size for p in range(start, start + n)]
            starts.append(starts[-1] + n)
            ends.append(start + n)
        blocks, query_starts, context_lens = to_device([tables, starts, ends], dev, torch.int32)
        input_ids, positions_t, write_t, last = to_device([fed, positions, write, [s - 1 for s in starts[1:]]], dev)
        blocks = blocks.view(len(items), width)
        self.cache.begin(num_blocks, write_t, None, width * size, in_place=True)
        seqs = [item.seq for item in items]
        want_hidden, want_embeds = _wants(seqs)
        return ModelInput(
            input_ids=input_ids[None], positions=positions_t[None],
            attention_mask=PagedLayout(blocks, query_starts, context_lens),
            last_indices=last, query_lens=[item.num_new for item in items],
            kv_len=width * size, seqs=seqs, is_prefill=True, output_hidden_states=want_hidden,
            output_input_embeds=want_embeds, context_lens=[item.start for item in items], packed=True,
        )

    # --- per-request state outputs ----------------------------------------------------------

    def _keep(self, store: dict[str, _StateRows], items: list[ScheduledSeq], inp: ModelInput,
              states: torch.Tensor, kind: str) -> None:
        """Each row's fed positions' `kind` rows, after those of the cached positions its forward
        skipped (read from the block states); with `keep_block_states`, stored there too."""
        first = 0
        side = self.block_states[kind]
        slots, stored = [], []
        for i, (item, n) in enumerate(zip(items, inp.query_lens)):
            seq, start = item.seq, item.start
            row = states[0, first:first + n] if inp.packed else states[i, :n]
            first += n
            if kind not in seq.state_kinds:
                continue
            rows = store.get(seq.request_id)
            if rows is None:
                capacity = seq.num_prompt_tokens + seq.max_tokens
                rows = store[seq.request_id] = _StateRows(capacity, states.shape[-1], states)
            if rows.n < start:  # a prefix-cache hit: its blocks hold these rows
                rows.put(rows.n, side.read(side.slots(seq.block_table, rows.n, start)))
            rows.put(start, row)
            if self.keep_block_states and seq.prefix_cacheable:
                slots += side.slots(seq.block_table, start, start + n)
                stored.append(rows.buf[start:start + n])
        if slots:
            side.write(slots, torch.cat(stored))

    def free_cache(self) -> int:
        """Drop the KV pools (a sleeping engine; nothing may be running): a fresh cache starts
        small and grows again. Returns the bytes freed."""
        freed = self.cache.num_bytes
        self.cache = PagedKVCache(self.model.num_layers, self.block_size, self.max_num_blocks, self.in_place)
        for side in self.block_states.values():
            freed += side.num_bytes
            side.pool = None
        return freed

    def close(self) -> None:
        self.cache = None
        self.static_decode = None  # its graphs hold their memory pool and the KV pools
        self.hidden.clear()
        self.embeds.clear()

    def release(self, seq: Sequence) -> None:
        self.sampler.release(seq.request_id)
        self.hidden.pop(seq.request_id, None)
        self.embeds.pop(seq.request_id, None)
        self.model.release(seq)


def _after_fewer_cached_keys(item: ScheduledSeq) -> bool:
    """A chunk after fewer cached keys than its own length (a short prefix-cache hit before a long
    prompt, a prompt's second chunk): the packed layout runs it as the last rows of a causal
    square, where the padded one masks the whole chunk x context."""
    return 0 < item.start < item.num_new


def _wants(seqs: list[Sequence]) -> tuple[bool, bool]:
    hidden = embeds = False
    for s in seqs:
        hidden |= s.return_hidden_states
        embeds |= s.return_input_embeds
    return hidden, embeds
