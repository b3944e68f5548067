"""The seam between the AR engine and a model family: `ARModel`, and its registry.

The engine owns scheduling, the paged KV cache, sampling, detokenization and streaming.
A model family owns what is specific to it:

- `build_prompt(inputs)`: turn `StageRequest.inputs` into prompt token ids plus any
  per-request state (multimodal embeddings, rope deltas, a thinker's hidden states);
- `forward(batch, cache)`: one batched prefill or decode forward, returning the logits
  at each row's last position and, when asked, last-layer hidden states and input
  embeddings. A family may build `inputs_embeds` itself (Qwen2.5-Omni's talker adds
  thinker states to codec embeddings), compute its own positions (M-RoPE) or mask
  logits (suppressed tokens);
- `on_sampled(batch, output, token_ids)`: an optional hook after sampling, e.g. CSM's
  depth decoder turning the backbone's codebook-0 token into a full frame, returning
  per-request extras for the output and keeping what the next step feeds in `seq.model_state`.

The scheduler, the paged KV cache (a transformers `Cache` passed as `cache=`), the
sampler, stop rules, detokenization and streaming are shared by every family.

`HFCausalLM` (hf_model.py) is the default: any transformers `AutoModelForCausalLM`.
Families register a subclass under the key their `StageSpec.model` names, from their
(torch-free) package `__init__.py`:

    register_ar_model("qwen2_5_omni.talker", "omnistage.models.qwen2_5_omni.talker:OmniTalker")
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from omnistage.ar.media_spans import MediaSpan
from omnistage.config.registry import REGISTRY
from omnistage.core.errors import RequestError
from omnistage.core.registry import ComponentRegistry, import_target

if TYPE_CHECKING:
    import torch

    from omnistage.ar.packed_attention import PackedAttention
    from omnistage.ar.paged_attention import PagedLayout

    from omnistage.ar.sequence import Sequence
    from omnistage.config.spec import StageSpec


@dataclass
class PromptInputs:
    token_ids: list[int]
    model_state: Any = None
    """Per-request state the family's forward reads back from `seq.model_state`."""
    streamed: bool = False
    """More inputs follow through `ARModel.extend_prompt` (a streaming upstream stage)."""
    media: tuple[MediaSpan, ...] = ()
    """The media items behind its placeholder tokens (positions and digests, in prompt order): the
    prefix cache keys its blocks by them. A family gives them for every item or for none; its first
    prefill must then merge features only into the positions it feeds (a hit skips the rest). A prompt
    fed as embeddings (a talker's) gives spans over its rows instead (`media_spans.row_spans`)."""
    cache_outputs: bool = True
    """Blocks of generated tokens may be published to the prefix cache too: their keys and values
    follow from the ids. False for a talker, whose decode steps also add the thinker's reply rows,
    which no digest covers: only its prompt's blocks are shared."""


@dataclass
class ModelInput:
    """One batched forward, padded to `[B, T]` (T = 1 in decode), or packed (`packed`): the
    rows' tokens laid end to end in one row of N, as vLLM's flattened batch, so a step's
    decodes and prompt chunks share one forward without padding."""
    input_ids: torch.Tensor
    """[B, T] long; padding positions hold 0. Packed: [1, N]."""
    positions: torch.Tensor
    """[B, T] long: each token's position in its sequence. Packed: [1, N]."""
    attention_mask: torch.Tensor | PackedAttention | PagedLayout
    """[B, 1, T, kv_len] bool, True = attend: causal, within the row's real tokens. Packed: a
    `PackedAttention` (which keys each row's tokens see), or with the KV blocks read in place a
    `PagedLayout` (each row's block table), read by `packed_sdpa`."""
    last_indices: torch.Tensor | None
    """Prefill: [B] index of each row's last real token (where logits are taken); decode: None.
    Packed: [B] index into N of each row's last token."""
    query_lens: list[int]
    """Real (unpadded) tokens per row."""
    kv_len: int
    """Key length the attention sees: the longest row's context after this forward (T in a
    prefill from position 0, where the keys are the fresh ones)."""
    seqs: list[Sequence]
    """The batch's sequences, row order (family state is `seq.model_state`)."""
    is_prefill: bool
    """Rows are prompt chunks (`last_indices` set); else one decode token each."""
    output_hidden_states: bool = False
    output_input_embeds: bool = False
    context_lens: list[int] | None = None
    """Tokens of each row already in the KV cache before this forward (row i feeds positions
    context_lens[i]..); all 0 in a prefill unless the model `supports_chunked_prefill`."""
    packed: bool = False
    """The packed layout (only for a model that `supports_packed_batch`)."""


@dataclass
class ModelOutput:
    logits: torch.Tensor
    """[B, V] at each row's last real position."""
    hidden_states: torch.Tensor | None = None
    """[B, T, H] last-layer (final-norm) hidden states, when `output_hidden_states` ([1, N, H] packed)."""
    input_embeds: torch.Tensor | None = None
    """[B, T, H] the embeddings fed to the first layer, when `output_input_embeds` ([1, N, H] packed)."""
    extras: list[dict[str, Any]] | None = None
    """Per-row tensors for `TextPayload.extras` (this step's values)."""


def sdpa_mask(batch: ModelInput) -> torch.Tensor | None:
    """The mask a family hands a transformers model for `batch`'s full-attention layers."""
    # NOTE: one row has no padding, so its mask is plain causal (prefill from position 0) or
    # all-visible (decode). Passing None lets SDPA take its is_causal path, as transformers'
    # generate() does for an unpadded prompt: the same kernel, so the same floats, and
    # near-tied logits of a greedy request resolve as in the reference. A chunk after
    # cached keys is not square-causal, so it keeps its mask.
    one_plain_row = len(batch.seqs) == 1 and not (batch.is_prefill and batch.context_lens and batch.context_lens[0])
    return None if one_plain_row else batch.attention_mask


class ARModel(ABC):
    """What the AR engine needs from a model (see module docstring)."""

    tokenizer: Any = None
    """A transformers fast tokenizer, or None when the stage emits codes rather than text."""
    eos_token_ids: tuple[int, ...] = ()
    max_position_embeddings: int = 0
    num_layers: int = 0
    """Attention layers that call `cache.update` (sizes the KV cache)."""
    kv_dims: tuple[int, int] | None = None
    """(kv heads, head dim) of those layers: with `num_layers` and the dtype, one token's KV bytes."""
    supports_chunked_prefill: bool = False
    """A prefill row may start at any cached position and feed any span of the sequence's
    tokens as ids (`ModelInput.context_lens`): what prompt chunks, prefix-cache hits and
    recompute after preemption need. A family that builds its prefill from per-request
    embeddings leaves it False: its prompts are prefilled whole, never reuse cached blocks,
    and reserve their blocks for their whole length at admission (so are never preempted)."""
    supports_packed_batch: bool = False
    """`forward` takes the packed layout (`ModelInput.packed`), its layers attending through
    `packed_attention.packed_sdpa`: a step with prompt chunks beside decodes or other chunks
    then runs as one forward, and the token budget counts real tokens. Else such a step is
    two forwards (decodes, then padded prompt chunks)."""
    supports_paged_attention: bool = False
    """`forward` takes the packed layout with a `paged_attention.PagedLayout` as its mask (its layers
    attend through `packed_sdpa`), and every layer is plain causal attention over the whole context:
    the engine may then read the KV blocks in place (deploy field `paged_attention`)."""
    supports_cuda_graphs: bool = False
    """`forward` can be replayed from a CUDA graph at static shapes (`compile: true`, see
    cuda_graphs.py): in a decode it reads only the tensors of `ModelInput` (never `seqs`,
    `query_lens`, `context_lens` or `seq.model_state`), returns no `extras`, and never syncs
    with the host. A stage whose model says False refuses `compile: true` at start-up."""
    supports_prepacked_linears: bool = False
    """`model`'s forward only calls its linear layers (never reads their `.weight`), so on CPU the
    engine may swap them for oneDNN ones with prepacked weights (core/cpu_linear.py)."""
    audio_frame_rate: float | None = None
    """Set by a talker, from its checkpoint: each generated token is one codec frame of audio at
    this many frames per second. The scheduler then knows how far each stream is ahead of a
    listener and runs those nearest an underrun first (scheduler.py, `deadline_order`)."""
    model: Any = None
    """The family's torch module (None once closed)."""
    device: Any = None

    @classmethod
    @abstractmethod
    def load(cls, model_path: str, stage: StageSpec | None, device: torch.device, dtype: torch.dtype) -> ARModel:
        ...

    @abstractmethod
    def forward(self, batch: ModelInput, cache: Any) -> ModelOutput:
        """Run one forward over `batch`, reading and writing `cache` (a transformers `Cache`)."""

    @property
    def vocab_size(self) -> int | None:
        """How many token ids the model embeds (its input embedding's rows); None when it
        has no single embedding table. A prompt id past it would index out of range."""
        get = getattr(self.model, "get_input_embeddings", None)
        embedding = get() if callable(get) else None
        rows = getattr(embedding, "num_embeddings", None)
        return rows if isinstance(rows, int) else None

    @functools.cached_property
    def max_token_chars(self) -> int:
        """The most characters one token stands for: the longest entry of the tokenizer's
        vocabulary (byte-level entries count bytes, never fewer than the text's characters)."""
        vocab = self.tokenizer.get_vocab() if self.tokenizer is not None else {}
        return max(map(len, vocab), default=1) or 1

    def check_prompt_size(self, inputs: Any, max_model_len: int) -> None:
        """Refuse a prompt that cannot fit `max_model_len` tokens from its length alone, before
        the tokenizer spends seconds and gigabytes on it: `max_token_chars` characters per token
        is the most text `max_model_len` tokens can hold."""
        limit = max_model_len * self.max_token_chars
        if isinstance(inputs, str):
            inputs = {"prompt": inputs}
        if not isinstance(inputs, dict):
            return
        ids = inputs.get("prompt_token_ids")
        if isinstance(ids, list) and len(ids) > max_model_len:
            raise RequestError("prompt", f"the prompt has {len(ids)} tokens, more than max_model_len={max_model_len}")
        num_chars = _text_chars(inputs.get("prompt")) + _text_chars(inputs.get("messages"))
        if num_chars > limit:
            raise RequestError("messages" if "messages" in inputs else "prompt",
                               f"the prompt has {num_chars} characters, more than max_model_len={max_model_len} "
                               f"tokens can hold (at most {self.max_token_chars} characters per token)")

    def check_params(self, params: Any) -> None:
        """Refuse, with a `RequestError` naming the field, the request's `SamplingParams` (its
        defaults applied) that this model cannot honour, e.g. those a family's own sampler has no
        place for. Default: all are honoured."""

    def build_prompt(self, inputs: Any) -> PromptInputs:
        """`StageRequest.inputs` -> prompt ids. The default accepts a str, or a dict with exactly one
        of "prompt" (str), "prompt_token_ids" (list[int]) or "messages" (chat messages; the
        checkpoint's chat template is applied with add_generation_prompt, and with "tools",
        OpenAI-shaped function definitions, when given)."""
        if isinstance(inputs, str):
            inputs = {"prompt": inputs}
        if not isinstance(inputs, dict):
            raise TypeError(f"AR inputs must be a str or a dict, got {type(inputs).__name__}")
        given = [k for k in ("prompt", "prompt_token_ids", "messages") if k in inputs]
        unknown = sorted(set(inputs) - {"prompt", "prompt_token_ids", "messages", "tools"})
        if unknown:
            raise ValueError(f"unknown AR input key(s) {unknown}; expected one of prompt, prompt_token_ids, messages")
        if len(given) != 1:
            raise ValueError(f"AR inputs need exactly one of prompt, prompt_token_ids, messages; got {given or 'none'}")
        if "prompt_token_ids" in inputs:
            ids = inputs["prompt_token_ids"]
            vocab = self.vocab_size or 2**63
            if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool)
                                                    and 0 <= t < vocab for t in ids):
                raise RequestError("prompt", f"prompt token ids must be integers in [0, {vocab}) (the model's "
                                             "vocabulary)")
            return PromptInputs(list(ids))
        if self.tokenizer is None:
            raise ValueError(f"this model has no tokenizer; pass prompt_token_ids instead of {given[0]}")
        if "tools" in inputs and "messages" not in inputs:
            raise ValueError("AR inputs: tools go with messages (the chat template renders them)")
        if "messages" in inputs:
            enc = self.tokenizer.apply_chat_template(inputs["messages"], tools=inputs.get("tools"),
                                                     add_generation_prompt=True, tokenize=True, return_dict=True)
            return PromptInputs(list(enc["input_ids"]))
        return PromptInputs(self.tokenizer(inputs["prompt"])["input_ids"])

    def is_token_reproducible(self, prompt: PromptInputs) -> bool:
        """Do this prompt's keys and values follow from its token ids, and the digests of its
        `media`, alone? Then its blocks may be shared through the prefix cache; if it has no media,
        it may also be recomputed after a preemption (media features are encoded once, for the
        first prefill). Default: when the model `supports_chunked_prefill` and the prompt is not
        streamed; a family whose ids stand for other inputs it gives no digests for says False for
        those prompts. A streamed prompt may say True only if its ids and digests are complete
        once `input_ready` (admission, where the cache is matched, waits for that)."""
        return self.supports_chunked_prefill and not prompt.streamed

    def extend_prompt(self, seq: Sequence, inputs: Any) -> None:
        """A streamed request's next input chunk (`PromptInputs.streamed`): add it to `seq.model_state`,
        and the digests of prompt rows it completes to `seq.media_spans` (see `is_token_reproducible`)."""
        raise ValueError(f"{type(self).__name__} takes no streamed input")

    def input_ready(self, seq: Sequence) -> bool:
        """Can a streamed request run its next step with the inputs it has? (False: it waits.)"""
        return True

    def on_sampled(self, batch: ModelInput, output: ModelOutput, token_ids: torch.Tensor) -> list[dict] | None:
        """Hook after sampling, before the tokens are appended: returns per-row extras for this
        step's outputs, or None. It may rewrite `token_ids` in place (e.g. to an EOS id when
        a family's own stop rule fires, such as CSM's all-zero frame)."""
        return None

    def release(self, seq: Sequence) -> None:
        """A sequence finished or was aborted: drop any per-request state held outside `seq`."""

    def close(self) -> None:
        """Free weights and buffers."""


# --- registry --------------------------------------------------------------------------

_AR_MODELS = ComponentRegistry("AR model", REGISTRY.discover)


def register_ar_model(key: str, target: str | type[ARModel]) -> None:
    """Run AR stages whose `StageSpec.model == key` on `target` (an ARModel subclass, or a
    "module:Class" path so a family's cheap `__init__.py` can register without importing torch."""
    _AR_MODELS.register(key, target)


def get_ar_model_class(key: str | None) -> type[ARModel]:
    """The ARModel for `StageSpec.model`; None = the generic transformers causal LM."""
    if key is None:
        return import_target("omnistage.ar.hf_model:HFCausalLM")
    return _AR_MODELS.get(key)


def _text_chars(value: Any) -> int:
    """Characters of text in a prompt or in chat messages (strings in any nesting: contents,
    text parts, tool arguments), without copying them."""
    total, stack = 0, [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            total += len(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return total
