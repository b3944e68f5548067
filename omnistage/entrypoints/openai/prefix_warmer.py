"""Incremental prefill: while frames arrive, keep the thinker's prefix cache warm with the
prompt of the frames buffered so far, so that a query pays only for its own suffix (its audio,
question and answer) instead of every frame's vision and language tokens.

Each warm-up is an ordinary engine request for the prompt so far with `max_tokens=1` and
text out only (the thinker alone runs): the AR engine publishes its full KV blocks to the
prefix cache, keyed by the tokens and the frames' digests, and the query's prompt (which
starts with the same tokens, context.py) takes them at admission. One warm-up runs at a
time; frames that come meanwhile are folded into the next one. A query waits for the
running warm-up (it computes the query's own prefix) instead of racing it.

A query after a warm-up that found nothing in the cache means the entry stage does not share
these prompts (a thinker that prefills media prompts whole, as Qwen3-Omni's; or one that
hands hidden states to a talker, before the AR engine caches those): the session stops
warming up, which would only be wasted compute.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from omnistage.ar.sampling_params import SamplingParams
from omnistage.entrypoints.openai.engine_client import EngineGateway
from omnistage.entrypoints.openai.errors import APIError
from omnistage.entrypoints.openai.realtime.conversation import new_id
from omnistage.entrypoints.openai.text_generation import prompt_tokens

logger = logging.getLogger(__name__)

MIN_VERDICT_TOKENS = 64
"""A warm-up this long holds a full KV block at any block size up to 64 (the AR engine's is 16,
`ar.engine.BLOCK_SIZE`, not imported: this module stays torch-free)."""
WARM_PARAMS = {"max_tokens": 1, "min_tokens": 0, "temperature": 0.0}
"""One token: the engine computes the prompt, samples once and frees the sequence."""


class PrefixWarmer:
    def __init__(self, gateway: EngineGateway, entry_stage: str, enabled: bool,
                 on_warm: Callable[[list[str]], Awaitable[None]]):
        self.gateway = gateway
        self.entry_stage = entry_stage
        self.enabled = enabled
        self.on_warm = on_warm
        """Called with the ids of the buffered frames a finished warm-up covered."""
        self._wanted: tuple[list[dict[str, Any]], list[str]] | None = None
        self._task: asyncio.Task | None = None
        self._warmed_tokens = 0  # prompt tokens of the longest warm-up since the last query

    def answered(self, num_cached_tokens: int) -> None:
        """A query finished with `num_cached_tokens` prompt tokens from the cache."""
        # A warm-up shorter than a KV block leaves no full block to share: no verdict then.
        if self._warmed_tokens >= MIN_VERDICT_TOKENS and not num_cached_tokens:
            logger.info("video chat: the entry stage shares none of the warmed prompt; no more warm-ups")
            self.enabled = False
        self._warmed_tokens = 0

    def warm(self, messages: list[dict[str, Any]], frame_ids: list[str]) -> None:
        """Prefill `messages` (the prompt so far, with the buffered frames `frame_ids`) when the
        running warm-up is done."""
        if not self.enabled or not messages:
            return
        self._wanted = (messages, frame_ids)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run())

    async def settle(self) -> None:
        """Before a query: drop what is not started, wait for what runs."""
        self._wanted = None
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)

    async def close(self) -> None:
        """The session ends: abort the running warm-up (closing its stream aborts the request)."""
        self._wanted = None
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        params = {self.entry_stage: SamplingParams.from_dict(WARM_PARAMS)}
        while self._wanted is not None:
            (messages, frame_ids), self._wanted = self._wanted, None
            try:
                stream = self.gateway.submit({"messages": messages}, params, new_id("warm"), ("text",))
                num_tokens = prompt_tokens(await stream.collect())
            except APIError as e:  # a full queue or a refused prompt: the query will say so itself
                logger.debug("video chat warm-up skipped: %s", e.message)
                continue
            self._warmed_tokens = max(self._warmed_tokens, num_tokens)
            await self.on_warm(frame_ids)
