"""What the step caches (tea_cache.py, first_block_cache.py, easycache.py, mag_cache.py) share: hooks on a family's
transformer blocks that skip the blocks on steps where their output barely changes,
deciding per request.

NOTE: one transformer call may carry several requests at different steps (step mode), or
the cond and uncond rows of one request (SD3, Z-Image). The cache keeps one `BranchCache`
per request (`DenoiseState.step_cache`), per transformer and branch, and decides per
request. When the rows of one call disagree (some compute, some skip), the head hook
stops the call before any tail block runs (`MixedDecisions`), and the call is split in
two: one over the rows that compute, one over those that skip, each deciding the same way
again. A request's result therefore never depends on who shares its batch; the cost is
one extra head block per split call.

The blocks are wrapped with diffusers' public hook registry (`diffusers.hooks.HookRegistry`),
never patched. A skipped call runs the head (first-block cache) or nothing (TeaCache, EasyCache),
adds each request's cached residual of the skipped blocks, and passes the tail through;
the transformer's own embeddings and output layers always run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, Literal

import torch

if TYPE_CHECKING:
    from omnistage.diffusion.accel.sequence_split import SplitSequence
    from omnistage.diffusion.guidance import Guidance, Predict, Rows
    from omnistage.diffusion.pipeline import DenoiseState

ModulatedInput = Callable[[torch.nn.Module, tuple, dict], torch.Tensor]
"""(first block, its args, its kwargs) -> the timestep-modulated input TeaCache compares."""


@dataclass(frozen=True)
class BlockChain:
    """Where a family's transformer runs its blocks: the family's one hook for the caches."""

    blocks: tuple[str, ...]
    """Attributes of the transformer holding its main block lists, in call order."""
    io: Literal["dual_stream", "single_stream", "positional_pair"]
    """dual_stream: blocks take `hidden_states=`/`encoder_hidden_states=` keywords and return
    (encoder_hidden_states, hidden_states) (FLUX, Qwen-Image, SD3); single_stream: blocks take
    the hidden states first, or as `hidden_states=`, and return them (Wan, Z-Image, Stable Audio,
    FLUX.2's single-stream blocks over the joined text and image tokens); positional_pair: blocks take
    (hidden_states, encoder_hidden_states, ...) positionally and return them in that order
    (HunyuanVideo-1.5, GLM-Image)."""
    token_mask_arg: int | None = None
    """Position of a [B, tokens] mask of real tokens among a block's args, when the
    transformer pads rows to the batch's longest (Z-Image); padding is left out of distances."""
    modulated_input: ModulatedInput | None = None
    """TeaCache's input of the first block; None = TeaCache is refused for the family."""
    tea_cache_coefficients: tuple[float, ...] | None = None
    """TeaCache's polynomial rescaling the relative L1 distance; None = no rescaling."""
    transformers: tuple[str, ...] = ("transformer",)
    """Pipeline attributes holding transformers with these blocks (absent ones are skipped)."""
    split_tokens: tuple[str, ...] = ()
    """Under Ulysses and ring, where the family's plan gathers the sequence after the blocks: the split
    sequences (as the plan's `split_lengths` names them) whose chunks a block's hidden states hold on a
    rank, in order (FLUX.2's single-stream blocks: "text tokens", then "image tokens"). The caches then
    run on each rank's shard, distances summed over the ranks with the padding left out, and each rank
    keeps its shard's residual (check_sequence_split). Empty = the caches are refused there."""

    def hidden(self, args: tuple, kwargs: dict) -> torch.Tensor:
        if self.io == "dual_stream" or not args:
            return kwargs["hidden_states"]
        return args[0]

    def with_input(self, args: tuple, kwargs: dict, hidden: torch.Tensor) -> tuple[tuple, dict]:
        """A block's args and kwargs with `hidden` in place of its hidden states."""
        if self.io == "dual_stream" or not args:
            return args, {**kwargs, "hidden_states": hidden}
        return (hidden, *args[1:]), kwargs

    def output_hidden(self, output: Any) -> torch.Tensor:
        if self.io == "positional_pair":
            return output[0]
        return output[1] if self.io == "dual_stream" else output

    def with_hidden(self, args: tuple, kwargs: dict, hidden: torch.Tensor) -> Any:
        """A block's output carrying `hidden` and the block's other stream unchanged. After the
        last block only the hidden states are used, so a skipped tail passes the text stream on."""
        if self.io == "positional_pair":
            return hidden, args[1]
        return (kwargs["encoder_hidden_states"], hidden) if self.io == "dual_stream" else hidden

    def token_mask(self, args: tuple, kwargs: dict) -> torch.Tensor | None:
        return None if self.token_mask_arg is None else args[self.token_mask_arg]


@dataclass(frozen=True)
class RankShard:
    """How one transformer's blocks hold a rank's shard of the sequence (check_sequence_split)."""

    split: Any
    """The transformer's sequence_split.SplitSequence: its ranks, and the padding of this forward."""
    at_head: bool
    """The plan splits the hidden states as the first block takes them, so the head hook sees them
    whole and takes this rank's chunk itself (Qwen-Image, Wan); False where the plan splits them
    before the blocks (FLUX, FLUX.2, SD3), so every hook sees the shard."""
    tokens: tuple[str, ...]
    """The chain's `split_tokens`: what the shard's mask of padding is made of."""

    def mask(self) -> torch.Tensor | None:
        return self.split.shard_mask(*self.tokens)


@dataclass
class BranchCache:
    """One request's cache for one transformer and branch."""

    previous: torch.Tensor | None = None
    """The tensor the next step is compared with (TeaCache: modulated input; FBC: head residual;
    EasyCache: the blocks' input)."""
    residual: torch.Tensor | None = None
    """[num_outputs, tokens, dim]: output minus input of the blocks a skipped step reuses."""
    accumulated: float = 0.0
    """TeaCache's accumulated rescaled distance (EasyCache's predicted change) since the last
    computed step."""
    output: torch.Tensor | None = None
    """EasyCache: the blocks' output at the last computed step."""
    rate: float | None = None
    """EasyCache: output change / input change between the last two computed steps. MagCache: the
    per-step ratio of the residual's magnitude between them."""
    ratio: float = 1.0
    """MagCache: the product of the per-step ratios over the steps skipped since the last computed one."""
    skipped: int = 0
    """MagCache: steps skipped in a row."""
    gap: int = 1
    """MagCache: steps between the last two computed ones."""


@dataclass
class StepCacheState:
    """`DenoiseState.step_cache`: a request's caches, new with every request."""

    branches: dict[tuple[str, str], BranchCache] = field(default_factory=dict)
    num_skipped: int = 0
    """Transformer forwards (one per branch per step) the cache skipped."""

    def branch(self, chain: str, branch: str) -> BranchCache:
        return self.branches.setdefault((chain, branch), BranchCache())


class MixedDecisions(Exception):  # noqa: N818 - control flow, not an error
    """The rows of one call disagree; `compute[i]` is row i's decision."""

    def __init__(self, compute: list[bool]):
        super().__init__("rows of one transformer call disagree on computing")
        self.compute = compute


@dataclass
class Call:
    """The transformer call in flight: its rows and, after a split, their forced decision."""

    rows: Rows
    forced: bool | None = None
    chain_name: str = ""
    """Which transformer the call runs (Wan 2.2 has two, each with its own caches)."""
    skipping: bool = False
    reference: torch.Tensor | None = None
    """The hidden states the residual of this call is measured from."""
    mask: torch.Tensor | None = None
    """The call's [B, tokens] mask of real tokens, if the family pads rows."""


class Policy:
    """When a request's step computes. `probe_head = False` (TeaCache, EasyCache) decides before the
    first block from its inputs, True (first-block cache) after the first block."""

    probe_head: bool
    split: Any = None
    """The sequence split (sequence_split.SplitSequence) whose shards the blocks run on, over whose
    ranks the distances are summed; None = the cache sees the whole sequence."""

    def signal(self, chain: BlockChain, block: torch.nn.Module, args: tuple, kwargs: dict,
               head_output: torch.Tensor | None) -> torch.Tensor:
        """[B, ...] per batch row: what is compared between steps."""
        raise NotImplementedError

    def should_compute(self, cache: BranchCache, signal: torch.Tensor, mask: torch.Tensor | None,
                       state: DenoiseState) -> bool:
        """Pure: decides without changing `cache` (a split call decides again)."""
        raise NotImplementedError

    def update(self, cache: BranchCache, signal: torch.Tensor, mask: torch.Tensor | None,
               state: DenoiseState, compute: bool) -> None:
        raise NotImplementedError

    def computed(self, cache: BranchCache, reference: torch.Tensor, output: torch.Tensor,
                 mask: torch.Tensor | None) -> None:
        """After a computed step, before `cache.residual` is replaced: the hidden states the
        residual is measured from and the last block's output (EasyCache learns its rate here)."""


def mean_abs(tensor: torch.Tensor, mask: torch.Tensor | None, split: Any = None) -> float:
    """mean |tensor| over a request's rows (real tokens only), over the ranks of `split` when
    `tensor` is a rank's shard of the sequence."""
    values = tensor.abs().float()
    if mask is None:
        return _ratio(values.sum(), torch.tensor(values.numel(), dtype=values.dtype), split, 1e-12)
    weight = mask.to(values.dtype).reshape(*mask.shape, *([1] * (values.ndim - mask.ndim)))
    return _ratio((values * weight).sum(), weight.sum() * values[0, 0].numel(), split, 1)


def relative_l1(current: torch.Tensor, previous: torch.Tensor, mask: torch.Tensor | None,
                split: Any = None) -> float:
    """mean |current - previous| / mean |previous| over a request's rows (real tokens only), over the
    ranks of `split` when they are a rank's shard of the sequence."""
    diff, ref = (current - previous).abs().float(), previous.abs().float()
    if mask is not None:
        weight = mask.to(diff.dtype).reshape(*mask.shape, *([1] * (diff.ndim - mask.ndim)))
        diff, ref = diff * weight, ref * weight
    return _ratio(diff.sum(), ref.sum(), split, 1e-12)


def _ratio(numerator: torch.Tensor, denominator: torch.Tensor, split: Any, floor: float) -> float:
    if split is not None:  # both sums, over every rank's shard
        numerator, denominator = split.sum_over_ranks(torch.stack([numerator, denominator.to(numerator)]))
    return (numerator / denominator.clamp_min(floor)).item()


def fit_tokens(residual: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """`residual` cut or zero-padded along the token axis to `like`'s: a transformer that pads
    rows to the batch's longest (Z-Image) may pad a request differently from step to step;
    real tokens come first, padding is discarded by the transformer."""
    if residual.shape[1] == like.shape[1]:
        return residual
    if residual.shape[1] > like.shape[1]:
        return residual[:, : like.shape[1]]
    pad = residual.new_zeros(residual.shape[0], like.shape[1] - residual.shape[1], *residual.shape[2:])
    return torch.cat([residual, pad], dim=1)


class StepCache:
    """A policy over the block chains of a pipeline's transformers."""

    def __init__(self, pipeline: Any, chain: BlockChain, policy: Policy, hook_name: str):
        from diffusers.hooks import HookRegistry

        self.chain = chain
        self.policy = policy
        self.call: Call | None = None
        self.num_split_calls = 0
        """Calls split because their rows disagreed (each costs one extra head block)."""
        self.shards: dict[str, RankShard] = {}
        """Transformer attribute -> how its blocks hold this rank's shard of the sequence (under
        Ulysses and ring), where the caches run on it."""
        self.gathered_heads: dict[str, SplitSequence] = {}
        """Transformer attribute -> its split, where the blocks take and return the
        whole sequence but the first block's output is a rank's shard (Z-Image's plan): the first-block
        cache gathers that output."""
        for attr in chain.transformers:
            transformer = getattr(pipeline, attr, None)
            if transformer is None:
                continue
            blocks = [block for name in chain.blocks for block in getattr(transformer, name)]
            if len(blocks) < 2:
                raise ValueError(f"cache_backend: {attr} of {pipeline.reference_class} has {len(blocks)} "
                                 "block(s); a step cache needs at least 2")
            if getattr(transformer, "_parallel_config", None) is not None:  # split over ranks (sequence_parallel.py)
                split = check_sequence_split(pipeline, transformer, chain, policy, hook_name)
                if isinstance(split, RankShard):
                    self.shards[attr], policy.split = split, split.split
                elif split is not None:
                    self.gathered_heads[attr] = split
            hooks = [_head_hook(self, attr)] + [_tail_hook(self, i == len(blocks) - 1) for i in range(1, len(blocks))]
            for block, hook in zip(blocks, hooks):
                HookRegistry.check_if_exists_or_initialize(block).register_hook(hook, hook_name)
        pipeline.guidance_runner = partial(_cached_guidance, inner=pipeline.guidance_runner, cache=self)

    def predict(self, predict: Predict, rows: Rows) -> list[torch.Tensor]:
        """`predict(rows)` with the cache deciding per row; splits a call whose rows disagree."""
        if not rows:
            return predict(rows)
        try:
            return self._run(predict, Call(rows))
        except MixedDecisions as mixed:
            self.num_split_calls += 1
            out: list[Any] = [None] * len(rows)
            for decision in (True, False):
                index = [i for i, c in enumerate(mixed.compute) if c == decision]
                preds = self._run(predict, Call([rows[i] for i in index], forced=decision))
                for i, pred in zip(index, preds):
                    out[i] = pred
            return out

    def _run(self, predict: Predict, call: Call) -> list[torch.Tensor]:
        self.call = call
        try:
            return predict(call.rows)
        finally:
            self.call = None

    # -- called by the hooks ------------------------------------------------------------

    def row_sizes(self, call: Call, hidden: torch.Tensor) -> list[int]:
        sizes = [state.latents.shape[0] for state, _ in call.rows]
        if sum(sizes) != hidden.shape[0]:
            raise RuntimeError(f"step cache: the transformer's batch has {hidden.shape[0]} rows, the call's "
                               f"requests {sum(sizes)} latents")
        return sizes

    def decide(self, call: Call, chain_name: str, signal: torch.Tensor, mask: torch.Tensor | None,
               hidden: torch.Tensor) -> bool:
        """Every row's decision (raises MixedDecisions when they differ); True = compute.
        Commits each row's cache update once the call is known to go ahead."""
        sizes = self.row_sizes(call, hidden)
        signals = list(signal.split(sizes))
        masks = list(mask.split(sizes)) if mask is not None else [None] * len(sizes)
        caches = [_state_cache(state).branch(chain_name, branch) for state, branch in call.rows]
        if call.forced is not None:
            decisions = [call.forced] * len(sizes)
        else:
            decisions = [self.policy.should_compute(c, s, m, state)
                         for c, s, m, (state, _) in zip(caches, signals, masks, call.rows)]
            if len(set(decisions)) > 1:
                raise MixedDecisions(decisions)
        for c, s, m, (state, _), compute in zip(caches, signals, masks, call.rows, decisions):
            self.policy.update(c, s, m, state, compute)
            if not compute:
                _state_cache(state).num_skipped += 1
        return decisions[0]

    def cached_residual(self, call: Call, chain_name: str, like: torch.Tensor) -> torch.Tensor:
        residuals = [_state_cache(state).branch(chain_name, branch).residual for state, branch in call.rows]
        if any(r is None for r in residuals):
            raise RuntimeError("step cache: a skipped step has no cached residual")
        sizes = self.row_sizes(call, like)
        return torch.cat([fit_tokens(r, piece) for r, piece in zip(residuals, like.split(sizes))]).to(like.dtype)

    def store_residual(self, call: Call, chain_name: str, output: torch.Tensor) -> None:
        sizes = self.row_sizes(call, output)
        masks = call.mask.split(sizes) if call.mask is not None else [None] * len(sizes)
        for (state, branch), reference, out, mask in zip(call.rows, call.reference.split(sizes), output.split(sizes),
                                                         masks):
            cache = _state_cache(state).branch(chain_name, branch)
            self.policy.computed(cache, reference, out, mask)
            cache.residual = out - reference


def check_sequence_split(pipeline: Any, transformer: torch.nn.Module, chain: BlockChain, policy: Policy,
                         backend: str) -> RankShard | SplitSequence | None:
    """How the cache runs where the transformer's sequence is split over ranks (Ulysses, ring or both):
    on the whole sequence (None), on the whole with the head's output gathered (the transformer's
    SplitSequence), on this rank's shard (a RankShard), or refused where its hooks
    would mix whole and shard.

    The cache's hooks wrap the context-parallel hooks of the same blocks (they are registered after
    them), so the head sees the whole sequence where the family's plan splits the hidden states as
    the first block takes them. If the plan also gathers them as the last block returns them
    (Z-Image), every hook sees the whole but the first-block cache's head, whose block returns a
    shard: it gathers that output, so every rank compares the whole residual of the first block and
    a skipped call returns the whole sequence, as the skipped blocks would (one all-gather a call,
    the size of the last block's). Its distances, residuals and padding are then one rank's, also
    where a row's padded length changes between steps (Z-Image pads a call's rows to its longest).
    If the plan gathers them after the blocks (Qwen-Image, Wan) or splits them before the blocks
    too (FLUX, FLUX.2, SD3), and the family names the split sequences its blocks hold
    (`split_tokens`), the caches run on each rank's shard: the head takes this rank's shard of its
    input and the signal where it sees them whole, every distance is summed over the ranks (padding
    left out), so every rank decides alike, and each keeps its shard's residual. Elsewhere a rank's
    cache would decide from its own shard."""
    from diffusers.models._modeling_parallel import ContextParallelOutput

    plan = pipeline.supported_accelerations.sequence_parallel.plan(transformer)
    first = f"{chain.blocks[0]}.0"
    last = f"{chain.blocks[-1]}.{len(getattr(transformer, chain.blocks[-1])) - 1}"
    if first in plan and isinstance(plan.get(last), ContextParallelOutput):
        return transformer._sequence_split if policy.probe_head else None
    if chain.split_tokens:
        return RankShard(transformer._sequence_split, first in plan, chain.split_tokens)
    why = ("its blocks run on a shard of the sequence, from which each rank's cache would decide alone (the "
           "family names no `split_tokens`)")
    degrees = transformer._parallel_config.context_parallel_config
    fields = [f"{name}={value}" for name, value in (("ulysses_degree", degrees.ulysses_degree),
                                                     ("ring_degree", degrees.ring_degree)) if value > 1]
    raise ValueError(f"cache_backend={backend} cannot be combined with {', '.join(fields)} for "
                     f"{pipeline.reference_class}: {why}")


def _state_cache(state: DenoiseState) -> StepCacheState:
    if state.step_cache is None:
        state.step_cache = StepCacheState()
    return state.step_cache


def _cached_guidance(states: list[DenoiseState], predict: Predict, guidance: Guidance, *,
                     inner: Callable, cache: StepCache) -> list[torch.Tensor]:
    """The pipeline's guidance function (plain or CFG-parallel) with the cache around each call."""
    return inner(states, partial(cache.predict, predict), guidance)


def _head_hook(cache: StepCache, chain_name: str) -> Any:
    from diffusers.hooks import ModelHook

    class HeadHook(ModelHook):
        """On the first block: decides for the call, then computes it or applies the residual."""

        def new_forward(self, module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
            return _head_forward(cache, chain_name, self.fn_ref.original_forward, module, args, kwargs)

    return HeadHook()


def _tail_hook(cache: StepCache, is_last: bool) -> Any:
    from diffusers.hooks import ModelHook

    class TailHook(ModelHook):
        """On every later block: passes through on a skipped call; the last stores the residual."""

        def new_forward(self, module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
            return _tail_forward(cache, is_last, self.fn_ref.original_forward, args, kwargs)

    return TailHook()


def _head_forward(cache: StepCache, chain_name: str, forward: Callable, module: torch.nn.Module,
                  args: tuple, kwargs: dict) -> Any:
    chain, call = cache.chain, cache.call
    if call is None:  # called outside a prediction: no caching
        return forward(*args, **kwargs)
    hidden = chain.hidden(args, kwargs)
    mask = chain.token_mask(args, kwargs)
    signal_args, signal_kwargs = args, kwargs
    shard = cache.shards.get(chain_name)
    if shard is not None:  # the blocks run on this rank's shard of the sequence
        mask = shard.mask()
        if shard.at_head:  # the head takes the whole sequence, the blocks this rank's shard of it
            hidden = shard.split.shard(hidden, 1)
            # Its signal too, from the shard (Wan's per-token modulation is split before the blocks).
            signal_args, signal_kwargs = chain.with_input(args, kwargs, hidden)
    call.chain_name, call.skipping, call.mask = chain_name, False, mask
    if not cache.policy.probe_head:  # TeaCache, EasyCache: decide from the inputs, maybe skip every block
        signal = cache.policy.signal(chain, module, signal_args, signal_kwargs, None)
        if cache.decide(call, chain_name, signal, mask, hidden):
            call.reference = hidden
            return forward(*args, **kwargs)
        call.skipping = True
        return chain.with_hidden(args, kwargs, hidden + cache.cached_residual(call, chain_name, hidden))
    output = forward(*args, **kwargs)  # first-block cache: run the head, compare its residual
    head = chain.output_hidden(output)
    if (split := cache.gathered_heads.get(chain_name)) is not None:  # a shard; the blocks return the whole
        head = split.gather(head, 1)
    signal = cache.policy.signal(chain, module, args, kwargs, head - hidden)
    if cache.decide(call, chain_name, signal, mask, hidden):
        call.reference = head
        return output
    call.skipping = True
    return chain.with_hidden(args, kwargs, head + cache.cached_residual(call, chain_name, head))


def _tail_forward(cache: StepCache, is_last: bool, forward: Callable, args: tuple, kwargs: dict) -> Any:
    call, chain = cache.call, cache.chain
    if call is None:
        return forward(*args, **kwargs)
    if call.skipping:
        return chain.with_hidden(args, kwargs, chain.hidden(args, kwargs))
    output = forward(*args, **kwargs)
    if is_last:
        cache.store_residual(call, call.chain_name, chain.output_hidden(output))
    return output


_KINDS = {"float": float, "int": int, "bool": bool, "str": str}


def threshold_problems(threshold: float, warmup_steps: int) -> list[str]:
    """What a threshold cache's config (`threshold`, `warmup_steps`) must satisfy, naming the key."""
    out = []
    if threshold < 0:
        out.append(f"cache_config.threshold: must be >= 0, got {threshold}")
    if warmup_steps < 0:
        out.append(f"cache_config.warmup_steps: must be >= 0, got {warmup_steps}")
    return out


def config_from(backend: str, config_class: type, cache_config: dict[str, Any]) -> Any:
    """`config_class` (a dataclass of float / int / bool / str fields with a `problems()`
    method) built from the deploy file's `cache_config`; an unknown key or a bad value raises
    ValueError naming `cache_config.<key>`."""
    import dataclasses

    fields = {f.name: _KINDS[str(f.type)] for f in dataclasses.fields(config_class)}
    values = {}
    for key, value in cache_config.items():
        if key not in fields:
            raise ValueError(f"cache_config.{key}: not an option of cache_backend {backend!r} "
                             f"(options: {', '.join(fields)})")
        kind = fields[key]
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
            raise ValueError(f"cache_config.{key}: must be {'an' if kind is int else 'a'} {kind.__name__}, got {value!r}")
        values[key] = value
    config = config_class(**values)
    problems = config.problems()
    if problems:
        raise ValueError("; ".join(problems))
    return config
