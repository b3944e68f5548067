"""One request inside the AR engine: its tokens, its KV blocks, and when it stops.

Plain Python (no torch): the scheduler and its tests work on these objects directly.
"""

from __future__ import annotations

import enum
import time
from typing import Any

from omnistage.ar.media_spans import MediaSpan
from omnistage.ar.sampling_params import SamplingParams
from omnistage.core.playback import Playback


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    """User params, per-step state and the stop rule of one request.

    `block_table` lists the KV-cache blocks holding its tokens (see block_manager.py);
    `num_computed_tokens` of its tokens have keys and values there. A running sequence
    is caught up when that is all its tokens but the last sampled one, which its next
    decode step feeds; a prompt prefilled in chunks is not caught up until its last chunk.
    """

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        *,
        max_model_len: int,
        eos_token_ids: tuple[int, ...] = (),
        arrival_time: float | None = None,
        detokenizer: Any = None,
        return_hidden_states: bool = False,
        return_input_embeds: bool = False,
        model_state: Any = None,
        grammar: Any = None,
        media_spans: tuple[MediaSpan, ...] = (),
        cache_outputs: bool = True,
    ) -> None:
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.output_token_ids: list[int] = []
        self.params = params
        self.max_model_len = max_model_len
        self.max_tokens = params.max_tokens if params.max_tokens is not None else max_model_len - len(prompt_token_ids)
        eos = frozenset() if params.ignore_eos else frozenset(eos_token_ids)
        self.stop_ids = frozenset(params.stop_token_ids) | eos
        """Ids that end the request once min_tokens is reached (EOS unless ignore_eos, plus stop_token_ids)."""
        self.detokenizer = detokenizer  # IncrementalDetokenizer | None (no tokenizer: codes, not text)
        self.return_hidden_states = return_hidden_states
        self.return_input_embeds = return_input_embeds
        self.model_state = model_state  # opaque per-request state owned by the ARModel family
        self.grammar = grammar  # structured_outputs.Grammar | None: the sampler masks and advances it
        self.logprobs: list[Any] | None = [] if params.logprobs is not None else None
        """The sampler's (token_id, logprob, top ids, top logprobs) per output token, when asked."""
        self.status = SequenceStatus.WAITING
        self.block_table: list[int] = []
        self.block_keys: list[tuple] = []  # prefix-cache keys of the full blocks so far
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0  # prompt tokens found in the prefix cache at admission
        self.state_kinds = frozenset(kind for kind, wanted in (("hidden_states", return_hidden_states),
                                                               ("input_embeds", return_input_embeds)) if wanted)
        """Per-position rows it returns: a cached block it reuses must hold them too (block_states.py)."""
        self.media_spans = media_spans
        """Where its prompt's media items sit and their digests: the prefix cache keys them (media_spans.py)."""
        self.lora: tuple[int, float] | None = None
        """(adapter id, scale) of its LoRA adapter once loaded (ar/lora.py), or None: the runner groups
        rows by it, and its KV blocks are keyed by it (a block computed under one adapter is no other's)."""
        self.prefix_cacheable = True
        """May reuse and publish cached blocks."""
        self.cache_outputs = cache_outputs
        """Publishes blocks holding generated tokens too (else only its prompt's: `PromptInputs.cache_outputs`)."""
        self.recomputable = True
        """May be preempted and recomputed later (else it reserves its blocks for its whole length at admission)."""
        self.num_preemptions = 0
        self.streamed = False  # inputs still arriving from a streaming upstream (ARModel.extend_prompt)
        self.awaiting_input = False
        """Streamed and its next step needs input that has not arrived: the scheduler passes it over."""
        self.finish_reason: str | None = None
        self.num_new_tokens = 0  # tokens appended by the last step (streamed as delta_token_ids)
        self.frame_seconds: float | None = None
        """Audio each output token stands for (a talker's codec frame), set by the engine for models
        with an `audio_frame_rate`: the scheduler then runs the streams nearest an underrun first."""
        self.playback = Playback()
        """A real-time player of the audio this sequence's tokens stand for (its deadline)."""
        # metrics
        self.arrival_time = time.monotonic() if arrival_time is None else arrival_time
        self.first_scheduled_time: float | None = None
        self.first_token_time: float | None = None

    # --- sizes ---------------------------------------------------------------------------

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def last_token_id(self) -> int:
        return self.output_token_ids[-1] if self.output_token_ids else self.prompt_token_ids[-1]

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_uncomputed_tokens(self) -> int:
        """Tokens the next forward must feed to catch up: 1 in decode, the rest of the prompt in prefill."""
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_prefilling(self) -> bool:
        """Still in its prompt (or, after a preemption, in its recompute)."""
        return self.num_uncomputed_tokens > 1 or self.num_computed_tokens < self.num_prompt_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    @property
    def needs_min_tokens_mask(self) -> bool:
        return self.num_output_tokens < self.params.min_tokens and bool(self.stop_ids)

    # --- state changes ---------------------------------------------------------------------

    def append_token(self, token_id: int, now: float | None = None) -> None:
        """Add one sampled token, advance the text, and finish the sequence if a stop rule fires."""
        now = time.monotonic() if now is None else now
        self.output_token_ids.append(token_id)
        self.num_new_tokens = 1
        if self.first_token_time is None:
            self.first_token_time = now
        if self.frame_seconds is not None:
            self.playback.receive(self.frame_seconds, now)
        reason = self._check_stop(token_id)
        if reason is not None:
            self.finish(reason)

    def _check_stop(self, token_id: int) -> str | None:
        # NOTE: the order matters. Stop rules (EOS, stop ids, stop strings) only count once
        # min_tokens exist; length limits always count, and a stop on the same token wins.
        past_min = self.num_output_tokens >= self.params.min_tokens
        detok = self.detokenizer
        if detok is not None:
            detok.step(token_id, check_stop=past_min)
            if detok.stopped:
                return "stop"
        if past_min and token_id in self.stop_ids:
            return "stop"
        if self.num_output_tokens >= self.max_tokens or self.num_tokens >= self.max_model_len:
            return "length"
        return None

    def finish(self, reason: str) -> None:
        self.status = SequenceStatus.FINISHED
        self.finish_reason = reason
        if self.detokenizer is not None:
            self.detokenizer.flush()

    def __repr__(self) -> str:
        return (f"Sequence({self.request_id!r}, status={self.status.value}, blocks={self.block_table}, "
                f"computed={self.num_computed_tokens}, prompt={self.num_prompt_tokens}, "
                f"output={self.num_output_tokens})")
