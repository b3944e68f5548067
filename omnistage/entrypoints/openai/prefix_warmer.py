"""Incremental prefill: while a session's input arrives (video frames, the user's speech), keep
the thinker's prefix cache warm with the prompt so far, so that the answer pays only for what
came after the last warm-up instead of its whole prompt. Shared by WS /v1/video/chat/stream
and WS /v1/realtime.

Each warm-up is an ordinary engine request for the prompt so far with `max_tokens=1` and text
out only (the thinker alone runs): the AR engine publishes its full KV blocks to the prefix
cache, keyed by the tokens and the media items' digests, and the answer's prompt (which starts
with the same tokens) takes them at admission. One warm-up runs at a time; input that comes
meanwhile is folded into the next one. An answer waits for the running warm-up (it computes
the answer's own prefix) instead of racing it.

A spoken answer hands the thinker's hidden states and input embeddings of every prompt position
to the talker, so it reuses only cached blocks that hold those rows too (ar/block_states.py):
when the answers are spoken, a warm-up asks for them (`speaks`), as the answer's thinker inputs
do (models/qwen_omni/handoff.py), and its blocks are stored with them.

An answer after a warm-up that found nothing in the cache means the entry stage does not share
these prompts: the session stops warming up, which would only be wasted compute.
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
TALKER_ROWS = {"return_hidden_states": True, "return_input_embeds": True}
"""The per-position rows a talker reads (the AR engine's input flags), which a spoken answer's
cached blocks must hold."""


class PrefixWarmer:
    def __init__(self, gateway: EngineGateway, entry_stage: str, enabled: bool,
                 on_warm: Callable[[Any], Awaitable[None]] | None = None, session_id: str | None = None):
        self.gateway = gateway
        self.entry_stage = entry_stage
        self.enabled = enabled
        self.on_warm = on_warm
        """Called with the tag of the `warm` call a finished warm-up covered."""
        self.session_id = session_id
        """Routes warm-ups and answers alike (a replicated thinker: the one holding the cache)."""
        self._wanted: tuple[list[dict[str, Any]], bool, Any] | None = None
        self._task: asyncio.Task | None = None
        self._warmed_tokens = 0  # prompt tokens of the longest warm-up since the last answer

    def answered(self, num_cached_tokens: int) -> None:
        """An answer finished with `num_cached_tokens` prompt tokens from the cache."""
        # A warm-up shorter than a KV block leaves no full block to share: no verdict then.
        if self._warmed_tokens >= MIN_VERDICT_TOKENS and not num_cached_tokens:
            logger.info("the entry stage shares none of the warmed prompt; no more warm-ups this session")
            self.enabled = False
        self._warmed_tokens = 0

    def warm(self, messages: list[dict[str, Any]], speaks: bool, tag: Any = None) -> None:
        """Prefill `messages` (the prompt so far) when the running warm-up is done; `speaks`: the
        answer will be spoken. `tag` goes to `on_warm` once it is done."""
        if not self.enabled or not messages:
            return
        self._wanted = (messages, speaks, tag)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run())

    async def settle(self) -> None:
        """Before an answer: drop what is not started, wait for what runs."""
        self._wanted = None
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)

    async def close(self) -> None:
        """Drop what is not started and abort the running warm-up (closing its stream aborts the
        request): the session ends, or the input it warmed was thrown away."""
        self._wanted = None
        self._warmed_tokens = 0  # no answer will start with it: no verdict from it
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        params = {self.entry_stage: SamplingParams.from_dict(WARM_PARAMS)}
        while self._wanted is not None:
            (messages, speaks, tag), self._wanted = self._wanted, None
            prompt = {"messages": messages, **(TALKER_ROWS if speaks else {})}
            try:
                stream = self.gateway.submit(prompt, params, new_id("warm"), ("text",), session_id=self.session_id)
                num_tokens = prompt_tokens(await stream.collect())
            except APIError as e:  # a full queue or a refused prompt: the answer will say so itself
                logger.debug("warm-up skipped: %s", e.message)
                continue
            self._warmed_tokens = max(self._warmed_tokens, num_tokens)
            if self.on_warm is not None:
                await self.on_warm(tag)
