"""WS /v1/realtime's incremental prefill on the zoo's random Qwen2.5-Omni and Qwen3-Omni (one
in-process engine per family, behind two apps: prefill on, and off as `--no-realtime-prefill` sets it): a turn
prefilled while it is spoken is answered from the thinker's prefix cache (`cached_tokens` in
`response.done`), in the same words and the same audio as its chunked prompt computed without the
cache; with the prefill off the turn is one clip and nothing of it is cached."""

from __future__ import annotations

import asyncio
import base64
import time
from dataclasses import replace

import numpy as np
import pytest

from omnistage.entrypoints.openai.realtime import audio_format
from omnistage.media.audio import resample
from omnistage.testing.voice import synthetic_speech
from ws_events import until

URL = "/v1/realtime?model=omni"
# Greedy thinker; a random talker rarely emits its end code: cap it, with a floor so there is audio.
OVERRIDES = {"0": {"default_sampling_params": {"max_tokens": 4, "temperature": 0}},
             "1": {"default_sampling_params": {"max_tokens": 16, "min_tokens": 8, "seed": 0}}}
MANUAL = {"type": "session.update", "session": {"type": "realtime", "output_modalities": ["audio"],
                                                "audio": {"input": {"turn_detection": None}}}}


@pytest.fixture(scope="module", params=["qwen2.5-omni", "qwen3-omni"])
def served(zoo, request):
    from fastapi.testclient import TestClient

    from omnistage import AsyncOmni
    from omnistage.entrypoints.openai.api_server import ServerSettings, create_app

    path = str(zoo(request.param))
    settings = ServerSettings(served_model_name="omni", model_path=path)
    engine = AsyncOmni(path, stage_overrides=OVERRIDES)
    with TestClient(create_app(settings, engine)) as client:  # its lifespan shuts the engine down
        off = TestClient(create_app(replace(settings, realtime_prefill=False), engine))  # no lifespan: one shutdown
        yield client, off, engine



def spoken_turn(client, speech: np.ndarray, ready=lambda: True) -> tuple[dict, str, bytes]:
    """One turn in manual mode, streamed in 100 ms appends, committed once `ready()`: (response.done's
    response, transcript, PCM16)."""
    with client.websocket_connect(URL) as ws:
        assert ws.receive_json()["type"] == "session.created"
        ws.send_json(MANUAL)
        until(ws, "session.updated")
        for i in range(0, len(speech), 2400):
            ws.send_json({"type": "input_audio_buffer.append",
                          "audio": base64.b64encode(audio_format.encode(speech[i:i + 2400], 24000, "audio/pcm")).decode()})
        deadline = time.time() + 30
        while not ready() and time.time() < deadline:
            time.sleep(0.01)
        ws.send_json({"type": "input_audio_buffer.commit"})
        ws.send_json({"type": "response.create"})
        events = until(ws, "response.done")
    transcript = "".join(e["delta"] for e in events if e["type"] == "response.output_audio_transcript.delta")
    audio = b"".join(base64.b64decode(e["delta"]) for e in events if e["type"] == "response.output_audio.delta")
    return events[-1]["response"], transcript, audio


def test_a_turn_prefilled_while_spoken_is_answered_from_the_cache_as_without_it(served, monkeypatch):
    client, off, engine = served
    answers = []  # (prompt, params, modalities) of each answer the session asks for
    warm_ups = []
    generate = engine.generate

    def spy(prompt, params=None, request_id=None, **kwargs):
        if request_id.startswith("resp_"):
            answers.append((prompt, params, kwargs["modalities"]))
        if request_id.startswith("warm_"):
            warm_ups.append(request_id)
        return generate(prompt, params, request_id, **kwargs)

    monkeypatch.setattr(engine, "generate", spy)
    # 2.2 s of speech: cut every 0.5 s, so the turn is five clips; the first cut's warm-up starts
    # at once, the cuts made while it runs are warmed next, and the answer waits for that one (a
    # client commits no sooner than its user stops: here once the second warm-up has started, which
    # Qwen3-Omni needs: its first clip's 7 audio tokens and the turn's header fill no 16-token block).
    # Each turn's voice is its own (no hits across turns).
    done, transcript, audio = spoken_turn(client, synthetic_speech(2.2, pitch=131.0), lambda: len(warm_ups) >= 2)
    cached = done["usage"]["input_token_details"]["cached_tokens"]
    off_done, _, _ = spoken_turn(off, synthetic_speech(2.2, pitch=137.0))
    off_cached = off_done["usage"]["input_token_details"]["cached_tokens"]
    # The turn's header and first clips fill a 16-token block that a warm-up cached; with the prefill
    # off nothing of the turn is.
    assert cached >= off_cached + 16, (done["usage"], off_done["usage"])
    assert transcript and audio

    # The same chunked prompt, without the cache: the clips as float64 at 16 kHz are the samples the
    # thinker's features are made of (each clip is resampled to 16 kHz float32 first), but their
    # digests differ, so no cached block of this turn matches.
    prompt, params, modalities = answers[0]
    [user] = [m for m in prompt["messages"] if m["role"] == "user"]
    clips = [p for p in user["content"] if p["type"] == "audio"]
    assert len(clips) == 5
    for part in clips:
        part["audio"] = resample(part["audio"], part["sample_rate"], 16000).astype(np.float64)
        part["sample_rate"] = 16000

    async def uncached():
        outs = [out async for out in generate(prompt, params, "uncached", modalities=modalities)]
        return outs[-1], b"".join(audio_format.encode(o.audio_chunk, o.sample_rate, "audio/pcm") for o in outs
                                  if o.audio_chunk is not None and len(o.audio_chunk))

    final, ref_audio = asyncio.run(uncached())
    assert final.metrics["stages"]["thinker"]["num_cached_tokens"] < cached
    assert final.text == transcript
    assert ref_audio == audio


def test_serve_flag_turns_the_realtime_prefill_off():
    from omnistage.entrypoints.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["serve", "m"]).realtime_prefill is True
    assert parser.parse_args(["serve", "m", "--no-realtime-prefill"]).realtime_prefill is False
