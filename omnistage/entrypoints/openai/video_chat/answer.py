"""One answer of a video chat session: the conversation and the query's turn in, one engine
request, the answer out as deltas, and the turn (with its answer) kept in the conversation.

Events: response.created; response.output_text.delta (text answers) or
response.output_audio_transcript.delta and response.output_audio.delta (base64 PCM16 at
24 kHz, as WS /v1/realtime's `audio/pcm`); then response.done with the status, the text and
the usage (`input_token_details.cached_tokens`: prompt tokens the thinker's prefix cache held).
Cancelling the task (the session closing) closes the engine stream, which aborts the request.
"""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.websockets import WebSocketDisconnect

from omnistage.ar.sampling_params import SamplingParams
from omnistage.entrypoints.openai.engine_client import EngineGateway
from omnistage.entrypoints.openai.errors import APIError, bad_request, from_value_error
from omnistage.entrypoints.openai.prefix_warmer import PrefixWarmer
from omnistage.entrypoints.openai.realtime import audio_format
from omnistage.entrypoints.openai.realtime.conversation import new_id
from omnistage.entrypoints.openai.text_generation import cached_tokens, completion_tokens, prompt_tokens
from omnistage.entrypoints.openai.video_chat.context import Context, Turn

Send = Callable[[dict[str, Any]], Awaitable[None]]
logger = logging.getLogger(__name__)


def stage_params(spec: Any, params_list: list[dict[str, Any]]) -> dict[str, SamplingParams]:
    """`sampling_params_list` as the engine takes it: entry i to the pipeline's i-th AR stage. The
    entry stage answers until the model stops (capped at max_model_len) unless a deploy or the
    list sets a cap, as chat does."""
    stages = [s for s in spec.stages if s.kind == "ar"]
    if len(params_list) > len(stages):
        raise bad_request(f"sampling_params_list: {len(params_list)} entries, but the pipeline has "
                          f"{len(stages)} AR stage(s) ({', '.join(s.name for s in stages)})",
                          param="sampling_params_list")
    out = {}
    for i, stage in enumerate(stages):
        given = params_list[i] if i < len(params_list) else {}
        fallback = {"max_tokens": None} if stage.name == spec.entry_stages[0].name else None
        if not given and fallback is None:
            continue  # the stage's deploy defaults
        try:
            out[stage.name] = SamplingParams.from_dict(dict(given), fallback=fallback)
        except (ValueError, TypeError) as e:
            error = from_value_error(e) if isinstance(e, ValueError) else bad_request(str(e))
            where = f"sampling_params_list[{i}]" + (f".{error.param}" if error.param else "")
            raise bad_request(f"{where}: {error.message}", param=where) from None
    return out


class Answer:
    def __init__(self, gateway: EngineGateway, settings: Any, context: Context, turn: Turn, warmer: PrefixWarmer,
                 send: Send, on_done: Callable[[], None]):
        self.gateway = gateway
        self.settings = settings
        self.context = context
        self.turn = turn
        self.warmer = warmer
        self.send = send
        self.on_done = on_done
        self.id = new_id("resp")
        self.is_audio = "audio" in settings.modalities
        self.task: asyncio.Task | None = None
        self._final: Any = None

    def start(self) -> None:
        self.task = asyncio.create_task(self._run())

    def cancel(self) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel()

    async def _run(self) -> None:
        try:
            await self._answer()
        except (WebSocketDisconnect, RuntimeError):  # the client went away (RuntimeError: sent to a closed socket)
            pass

    async def _answer(self) -> None:
        status, details = "completed", None
        try:
            await self.send({"type": "response.created", "response": self._response("in_progress")})
            await self.warmer.settle()  # a running warm-up computes this prompt's prefix: let it finish
            await self._stream()
            self.warmer.answered(cached_tokens(self._final, self.gateway.engine.spec.entry_stages[0].name))
            if self._final is not None and self._final.finish_reason == "length":
                status, details = "incomplete", {"type": "incomplete", "reason": "max_output_tokens"}
        except asyncio.CancelledError:
            status, details = "cancelled", {"type": "cancelled", "reason": "client_cancelled"}
            raise
        except APIError as e:
            status = "failed"
            details = {"type": "failed", "error": {"type": e.type, "code": e.code, "message": e.message,
                                                   "param": e.param}}
        except Exception:  # noqa: BLE001 - a bug fails this answer, never leaves the session waiting
            logger.exception("video chat answer %s failed", self.id)
            status = "failed"
            details = {"type": "failed", "error": {"type": "server_error", "code": "internal_error",
                                                   "message": "the answer failed inside the server"}}
        finally:
            self.context.turns.append(self.turn)  # the frames were shown; the answer is what was said
        await self.send({"type": "response.done", "response": self._response(status, details)})
        self.on_done()

    async def _stream(self) -> None:
        prompt: dict[str, Any] = {"messages": self.context.messages(self.turn)}
        if self.is_audio and self.settings.voice is not None:
            prompt["voice"] = self.settings.voice  # omni models read the voice from the prompt
        params = stage_params(self.gateway.engine.spec, self.settings.sampling_params_list)
        wanted = ("text", "audio") if self.is_audio else ("text",)
        text_kind = "response.output_audio_transcript.delta" if self.is_audio else "response.output_text.delta"
        async for out in self.gateway.submit(prompt, params, self.id, wanted):  # closing it aborts the request
            if out.text_delta:
                self.turn.answer += out.text_delta
                await self.send({"type": text_kind, "response_id": self.id, "delta": out.text_delta})
            if self.is_audio and out.audio_chunk is not None and len(out.audio_chunk):
                data = audio_format.encode(out.audio_chunk, out.sample_rate, "audio/pcm")
                await self.send({"type": "response.output_audio.delta", "response_id": self.id,
                                 "delta": base64.b64encode(data).decode()})
            if out.finished:
                self._final = out

    def _response(self, status: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
        response: dict[str, Any] = {"id": self.id, "object": "video_chat.response", "status": status,
                                    "status_details": details, "output_modalities": list(self.settings.modalities)}
        if status != "in_progress":
            prompt, completion = prompt_tokens(self._final), completion_tokens(self._final)
            entry = self.gateway.engine.spec.entry_stages[0].name
            response["output_text"] = self.turn.answer
            response["usage"] = {"total_tokens": prompt + completion, "input_tokens": prompt,
                                 "output_tokens": completion,
                                 "input_token_details": {"cached_tokens": cached_tokens(self._final, entry)}}
        return response
