"""Per-request sampling over a batch of logits.

Order, as in transformers' logits processors: repetition penalty and min_tokens (these
apply to greedy requests too), the grammar mask of structured-output rows, then
temperature, top-k, top-p, min-p, then a draw. Rows with and without a grammar share
one batch: the mask only touches its own rows. Log-probabilities (when a row asks) are
taken after the grammar mask and temperature, before truncation, as vLLM's
"processed" logprobs; each grammar then consumes its row's sampled token.

The draw is an exponential race (argmax of p / q with q ~ Exp(1)), which samples
exactly from p. Seeded requests fill their row of q from their own generator with
`exponential_` (torch.multinomial's draw, so a seeded request can match a reference), so
their tokens do not depend on what else is in the batch; unseeded rows draw q as -log(U),
the same distribution at a third of `exponential_`'s cost on CPU. A batch of only plain greedy rows
skips all of this and is one argmax.
"""

from __future__ import annotations

import torch

from omnistage.ar.sequence import Sequence
from omnistage.ar.staging import to_device


SampledLogprobs = tuple[float, list[int], list[float]]
"""One row's (sampled token's logprob, top ids, their logprobs), most likely first."""


class _BatchParams:
    """A batch's sampling parameters as device tensors, staged in one copy and kept while the
    batch's rows stay the same (a decode run; CSM's depth decoder samples 31 times per frame)."""

    def __init__(self, seqs: list[Sequence], device: torch.device) -> None:
        self.params = [s.params for s in seqs]
        self.greedy = [p.is_greedy for p in self.params]
        self.top_k = [p.top_k for p in self.params]
        self.top_p = [p.top_p for p in self.params]
        temps = [1.0 if p.is_greedy else p.temperature for p in self.params]
        self.temps, self.top_p_t, self.min_p, self.is_greedy = to_device(
            [temps, self.top_p, [p.min_p for p in self.params], [float(g) for g in self.greedy]], device, torch.float32)
        self.is_greedy = self.is_greedy.bool()
        self._top_k: dict[int, torch.Tensor] = {}

    def top_k_t(self, vocab: int) -> torch.Tensor:
        """Each row's k, 0 (off) meaning the whole `vocab` (CSM's heads differ in width)."""
        t = self._top_k.get(vocab)
        if t is None:
            (t,) = to_device([[k if 0 < k < vocab else vocab for k in self.top_k]], self.is_greedy.device)
            self._top_k[vocab] = t
        return t

    def matches(self, seqs: list[Sequence]) -> bool:
        return len(seqs) == len(self.params) and all(s.params is p for s, p in zip(seqs, self.params))


class Sampler:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._generators: dict[str, torch.Generator] = {}
        self._id_tensors: dict[frozenset[int], torch.Tensor] = {}  # stop-id sets -> index tensors (few, reused)
        self._bit_shifts = torch.arange(32, dtype=torch.int32)
        self.last_logprobs: list[SampledLogprobs | None] | None = None
        """Per row of the last call, for rows whose sequence asked for logprobs (None: no row did)."""
        self._batch: _BatchParams | None = None

    def _batch_params(self, seqs: list[Sequence]) -> _BatchParams:
        if self._batch is None or not self._batch.matches(seqs):
            self._batch = _BatchParams(seqs, self.device)
        return self._batch

    def release(self, request_id: str) -> None:
        self._generators.pop(request_id, None)

    def __call__(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        """logits [B, V] -> token ids [B] (long, on logits' device)."""
        logits = logits.float()
        self._apply_penalties(logits, seqs)
        grammar_rows = self._apply_grammars(logits, seqs)
        if all(s.params.is_greedy for s in seqs):
            tokens = logits.argmax(dim=-1)
        else:
            batch = self._batch_params(seqs)
            tokens = self._sample(logits, seqs, batch)
            if any(batch.greedy):
                tokens = torch.where(batch.is_greedy, logits.argmax(dim=-1), tokens)
        self.last_logprobs = self._logprobs(logits, seqs, tokens)
        if grammar_rows:
            picked = tokens[grammar_rows].tolist()
            for i, token_id in zip(grammar_rows, picked):
                seqs[i].grammar.accept(token_id)
        return tokens

    # --- 1. penalties -----------------------------------------------------------------------

    def _apply_penalties(self, logits: torch.Tensor, seqs: list[Sequence]) -> None:
        _repetition_penalties(logits, seqs)
        masked_rows: list[int] = []
        masked_ids: set[frozenset[int]] = set()
        for i, seq in enumerate(seqs):
            if seq.needs_min_tokens_mask:
                masked_rows.append(i)
                masked_ids.add(seq.stop_ids)
        if not masked_rows:
            return
        # min_tokens: hide EOS and stop ids. Usually every masked row has the same ids (EOS),
        # so this is one indexed fill; otherwise one per distinct set.
        for ids in masked_ids:
            rows = [i for i in masked_rows if seqs[i].stop_ids == ids] if len(masked_ids) > 1 else masked_rows
            cols = self._ids_tensor(ids, logits.shape[-1])
            if len(rows) == len(seqs):
                logits[:, cols] = -float("inf")
            else:
                logits[torch.tensor(rows, device=logits.device)[:, None], cols] = -float("inf")

    def _ids_tensor(self, ids: frozenset[int], vocab: int) -> torch.Tensor:
        t = self._id_tensors.get(ids)
        if t is None:
            if len(self._id_tensors) > 256:  # per-request stop_token_ids make new sets; keep this bounded
                self._id_tensors.clear()
            t = self._id_tensors[ids] = torch.tensor(sorted(i for i in ids if i < vocab), dtype=torch.long,
                                                     device=self.device)
        return t

    # --- 2. grammar masks (structured outputs) -----------------------------------------------

    def _apply_grammars(self, logits: torch.Tensor, seqs: list[Sequence]) -> list[int]:
        """Mask the tokens each row's grammar forbids; returns those rows."""
        rows = [i for i, s in enumerate(seqs) if getattr(s, "grammar", None) is not None and s.grammar.is_active]
        if not rows:
            return rows
        words = torch.stack([torch.frombuffer(bytearray(seqs[i].grammar.bitmask()), dtype=torch.int32)
                             for i in rows])
        allowed = ((words[:, :, None] >> self._bit_shifts) & 1).view(len(rows), -1).bool()
        vocab = logits.shape[-1]
        if allowed.shape[1] < vocab:  # ids past the tokenizer's vocabulary are never allowed
            allowed = torch.cat([allowed, allowed.new_zeros(len(rows), vocab - allowed.shape[1])], dim=1)
        index = torch.tensor(rows, device=logits.device)
        logits[index] = logits[index].masked_fill(~allowed[:, :vocab].to(logits.device), -float("inf"))
        return rows

    # --- 3. log-probabilities -----------------------------------------------------------------

    def _logprobs(self, logits: torch.Tensor, seqs: list[Sequence],
                  tokens: torch.Tensor) -> list[SampledLogprobs | None] | None:
        rows = [i for i, s in enumerate(seqs) if getattr(s, "logprobs", None) is not None]
        if not rows:
            return None
        index = torch.tensor(rows, device=logits.device)
        temps = torch.tensor([1.0 if seqs[i].params.is_greedy else seqs[i].params.temperature for i in rows],
                             device=logits.device)
        lp = (logits[index] / temps[:, None]).log_softmax(dim=-1)
        chosen = lp.gather(-1, tokens[index][:, None])[:, 0].tolist()
        k = max(seqs[i].params.logprobs for i in rows)
        top_lp, top_ids = lp.topk(k, dim=-1) if k else (lp[:, :0], lp[:, :0].long())
        top_lp, top_ids = top_lp.tolist(), top_ids.tolist()
        out: list[SampledLogprobs | None] = [None] * len(seqs)
        for j, i in enumerate(rows):
            n = seqs[i].params.logprobs
            out[i] = (chosen[j], top_ids[j][:n], top_lp[j][:n])
        return out

    # --- 4. temperature, top-k, top-p, min-p, draw ------------------------------------------

    def _sample(self, logits: torch.Tensor, seqs: list[Sequence], batch: _BatchParams) -> torch.Tensor:
        params = batch.params
        x = logits / batch.temps[:, None]
        vocab = x.shape[-1]
        if all(p.seed is None and 0 < p.top_k < vocab and p.top_p >= 1.0 and p.min_p == 0 for p in params):
            return _sample_top_k(x, max(batch.top_k), batch.top_k_t(vocab))
        if any(p.top_k > 0 or p.top_p < 1.0 for p in params):
            x = _top_k_top_p(x, batch)
        probs = x.softmax(dim=-1)
        if any(p.min_p > 0 for p in params):
            probs = probs.masked_fill(probs < batch.min_p[:, None] * probs.amax(dim=-1, keepdim=True), 0.0)
        unseeded = [i for i, p in enumerate(params) if p.seed is None]
        if len(unseeded) == len(params):
            q = _exponential(probs)
        else:
            q = torch.empty_like(probs)
            if unseeded:
                q[unseeded] = _exponential(probs[unseeded])
            for i, seq in enumerate(seqs):
                if seq.params.seed is not None:
                    q[i].exponential_(generator=self._generator(seq))
        return (probs / q).argmax(dim=-1)

    def _generator(self, seq: Sequence) -> torch.Generator:
        gen = self._generators.get(seq.request_id)
        if gen is None:
            gen = torch.Generator(device=self.device).manual_seed(seq.params.seed)
            self._generators[seq.request_id] = gen
        return gen


def _exponential(like: torch.Tensor) -> torch.Tensor:
    """Exp(1) noise shaped like `like`, as -log(U)."""
    return torch.rand_like(like).log_().neg_()


def _sample_top_k(x: torch.Tensor, max_k: int, top_k: torch.Tensor) -> torch.Tensor:
    """Unseeded top-k rows: the same draw among each row's k best logits only, a fraction of
    the full-vocabulary work (it dominates small models' steps: CSM samples every codebook)."""
    values, ids = x.topk(max_k, dim=-1)
    beyond = torch.arange(values.shape[1], device=x.device) >= top_k[:, None]
    probs = values.masked_fill(beyond, -float("inf")).softmax(dim=-1)
    pick = (probs / _exponential(probs)).argmax(dim=-1)
    return ids.gather(-1, pick[:, None])[:, 0]


def _top_k_top_p(x: torch.Tensor, batch: _BatchParams) -> torch.Tensor:
    """Mask logits outside each row's top-k and nucleus (0 / 1.0 = off for that row)."""
    vocab = x.shape[-1]
    k = batch.top_k_t(vocab)
    if all(p >= 1.0 for p in batch.top_p):
        # Top-k alone needs each row's k-th largest value, not a full sort (which dominates
        # a small model's step, e.g. CSM's depth decoder samples 31 codebooks per frame).
        largest = x.topk(max(k if 0 < k < vocab else vocab for k in batch.top_k), dim=-1).values
        kth = largest.gather(-1, k[:, None] - 1)
        return x.masked_fill(x < kth, -float("inf"))
    sorted_x, order = x.sort(dim=-1, descending=False)
    kth = sorted_x.gather(-1, (vocab - k)[:, None])  # the k-th largest value per row
    sorted_x = sorted_x.masked_fill(sorted_x < kth, -float("inf"))
    cum = sorted_x.softmax(dim=-1).cumsum(dim=-1)
    drop = cum <= (1 - batch.top_p_t)[:, None]
    drop[:, -1] = False  # always keep the most likely token
    sorted_x = sorted_x.masked_fill(drop, -float("inf"))
    return torch.empty_like(x).scatter_(-1, order, sorted_x)


def _repetition_penalties(logits: torch.Tensor, seqs: list[Sequence]) -> None:
    """In place, one indexed update for the batch: in each row whose sequence has a repetition penalty,
    divide the positive logits of the tokens it has seen by the penalty, multiply the negative ones."""
    rows: list[int] = []
    cols: list[int] = []
    factors: list[float] = []
    vocab = logits.shape[-1]
    for i, seq in enumerate(seqs):
        if seq.params.repetition_penalty != 1.0:
            # each seen id once; ids past the logits' width are dropped on the host (a boolean index
            # would wait on the device)
            seen = [t for t in set(seq.all_token_ids) if t < vocab]
            rows += [i] * len(seen)
            cols += seen
            factors += [seq.params.repetition_penalty] * len(seen)
    if not rows:
        return
    rows_t, cols_t = to_device([rows, cols], logits.device)
    (factor,) = to_device([factors], logits.device, torch.float32)
    seen = logits[rows_t, cols_t]
    logits[rows_t, cols_t] = torch.where(seen < 0, seen * factor, seen / factor)
