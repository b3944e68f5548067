"""One request inside the AR engine: its tokens, its slot, and when it stops.

Plain Python (no torch): the scheduler and its tests work on these objects directly.
"""

from __future__ import annotations

import enum
import time
from typing import Any

from omnistage.ar.sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    """User params, per-step state and the stop rule of one request.

    `slot` is the row of the KV cache this sequence owns while running; the scheduler
    keeps running sequences in slots 0..n-1 in order (see `Scheduler.free`).
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
        self.slot = -1
        self.finish_reason: str | None = None
        self.num_new_tokens = 0  # tokens appended by the last step (streamed as delta_token_ids)
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
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    @property
    def needs_min_tokens_mask(self) -> bool:
        return self.num_output_tokens < self.params.min_tokens and bool(self.stop_ids)

    # --- state changes ---------------------------------------------------------------------

    def append_token(self, token_id: int) -> None:
        """Add one sampled token, advance the text, and finish the sequence if a stop rule fires."""
        self.output_token_ids.append(token_id)
        self.num_new_tokens = 1
        if self.first_token_time is None:
            self.first_token_time = time.monotonic()
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
        return (f"Sequence({self.request_id!r}, status={self.status.value}, slot={self.slot}, "
                f"prompt={self.num_prompt_tokens}, output={self.num_output_tokens})")
