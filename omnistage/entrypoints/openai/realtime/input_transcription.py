"""Input audio transcription: the words of a committed user turn, for the client.

Each committed audio item, when the session asks for it, gets one engine request of the
thinker alone (the prompt POST /v1/audio/transcriptions sends), run beside the response:
`conversation.item.input_audio_transcription.delta` events as the words come, then
`.completed` (transcript, usage) or `.failed`. The transcript is for the client and the
item's `transcript`; the model keeps hearing the audio itself.

`heard_transcript` is the same request for the other side: the words of the part of an answer's
audio that the client says was played (conversation.item.truncate), which is what the model
reads of that answer from then on.
"""

from __future__ import annotations

import logging
from typing import Any

from omnistage.entrypoints.openai.audio.transcriptions import transcription_request, usage
from omnistage.entrypoints.openai.engine_client import EngineGateway
from omnistage.entrypoints.openai.errors import APIError
from omnistage.entrypoints.openai.realtime.conversation import Item, Part, new_id
from omnistage.entrypoints.openai.realtime.protocol import Transcription
from omnistage.entrypoints.openai.realtime.response import Send

logger = logging.getLogger(__name__)


async def transcribe(gateway: EngineGateway, item: Item, config: Transcription, send: Send) -> None:
    part = item.parts[0]
    where = {"item_id": item.id, "content_index": 0}
    prompt, params = transcription_request(gateway, part.audio, part.sample_rate, config.language, config.prompt)
    final: Any = None
    try:
        # Closing the stream (this task cancelled when the session ends) aborts the request.
        async for out in gateway.submit(prompt, params, new_id("transcript"), ("text",)):
            if out.text_delta:
                await send({"type": "conversation.item.input_audio_transcription.delta", **where,
                            "delta": out.text_delta})
            if out.finished:
                final = out
    except APIError as e:
        await send({"type": "conversation.item.input_audio_transcription.failed", **where,
                    "error": {"type": e.type, "code": e.code, "message": e.message, "param": e.param}})
        return
    part.text = (final.text or "").strip() if final is not None else ""
    await send({"type": "conversation.item.input_audio_transcription.completed", **where,
                "transcript": part.text, "usage": usage(final)})


async def heard_transcript(gateway: EngineGateway, part: Part) -> None:
    """Set an answer's audio `part` (cut to what was heard) to the transcript of that audio."""
    prompt, params = transcription_request(gateway, part.audio, part.sample_rate)
    try:
        final = await gateway.submit(prompt, params, new_id("heard"), ("text",)).collect()
    except APIError as e:  # the answer stays without words: the model reads nothing unheard
        logger.warning("the heard part of an answer was not transcribed: %s", e.message)
        return
    part.text = (final.text or "").strip() if final is not None else ""
