"""One request per task against the OpenAI routes, timed on the client side.

Each task function sends one request and returns a `RequestResult`; it measures the
end-to-end latency and, for streamed answers, the time to the first audio/token chunk.
"""

from __future__ import annotations

import base64
import io
import json
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from omnistage.core.playback import Playback


@dataclass
class TaskOptions:
    model: str | None = None
    size: str = "64x64"
    steps: int | None = None
    frames: int | None = None
    voice: str | None = None
    max_tokens: int = 64
    extra_body: dict[str, Any] = field(default_factory=dict)


@dataclass
class RequestResult:
    ok: bool
    latency: float = 0.0
    ttfp: float | None = None  # time to first packet/token of a streamed answer
    ttfa: float | None = None  # time to its first audio, when it has audio
    images: int = 0
    frames: int = 0
    audio_seconds: float = 0.0
    tokens: int = 0
    underruns: list[float] = field(default_factory=list)  # stalls of a real-time player of a stream (s)
    error: str = ""


def _tiny_png() -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (64, 64), (128, 64, 32)).save(buf, format="PNG")
    return buf.getvalue()


def _error(resp: httpx.Response) -> str:
    try:
        return resp.json()["error"]["message"]
    except Exception:
        return f"HTTP {resp.status_code}: {resp.text[:200]}"


async def t2i(client: httpx.AsyncClient, row: dict, opt: TaskOptions) -> RequestResult:
    body = {"prompt": row["prompt"], "size": opt.size, "n": 1, "response_format": "b64_json", **opt.extra_body}
    if opt.model:
        body["model"] = opt.model
    if opt.steps:
        body["num_inference_steps"] = opt.steps
    body.update({k: v for k, v in row.items() if k != "prompt"})
    t0 = time.perf_counter()
    resp = await client.post("/v1/images/generations", json=body)
    latency = time.perf_counter() - t0
    if resp.status_code != 200:
        return RequestResult(False, latency, error=_error(resp))
    return RequestResult(True, latency, images=len(resp.json()["data"]))


async def edit(client: httpx.AsyncClient, row: dict, opt: TaskOptions) -> RequestResult:
    data = {"prompt": row["prompt"], "size": opt.size, "n": "1", "response_format": "b64_json"}
    if opt.model:
        data["model"] = opt.model
    if opt.steps:
        data["num_inference_steps"] = str(opt.steps)
    data.update({k: str(v) for k, v in opt.extra_body.items()})
    t0 = time.perf_counter()
    resp = await client.post("/v1/images/edits", data=data, files={"image": ("in.png", _tiny_png(), "image/png")})
    latency = time.perf_counter() - t0
    if resp.status_code != 200:
        return RequestResult(False, latency, error=_error(resp))
    return RequestResult(True, latency, images=len(resp.json()["data"]))


async def t2v(client: httpx.AsyncClient, row: dict, opt: TaskOptions) -> RequestResult:
    data = {"prompt": row["prompt"], "size": opt.size}
    if opt.model:
        data["model"] = opt.model
    if opt.steps:
        data["num_inference_steps"] = str(opt.steps)
    if opt.frames:
        data["num_frames"] = str(opt.frames)
    if opt.extra_body:
        data["extra_params"] = json.dumps(opt.extra_body)
    t0 = time.perf_counter()
    resp = await client.post("/v1/videos/sync", data=data)
    latency = time.perf_counter() - t0
    if resp.status_code != 200:
        return RequestResult(False, latency, error=_error(resp))
    frames = int(resp.headers.get("x-num-frames", opt.frames or 0))
    return RequestResult(True, latency, frames=frames)


async def tts(client: httpx.AsyncClient, row: dict, opt: TaskOptions) -> RequestResult:
    body = {"input": row["prompt"], "response_format": "pcm", "stream_format": "audio", **opt.extra_body}
    if opt.model:
        body["model"] = opt.model
    if opt.voice:
        body["voice"] = opt.voice
    t0 = time.perf_counter()
    ttfp, num_bytes = None, 0
    async with client.stream("POST", "/v1/audio/speech", json=body) as resp:
        if resp.status_code != 200:
            await resp.aread()
            return RequestResult(False, time.perf_counter() - t0, error=_error(resp))
        rate = int(resp.headers.get("x-sample-rate", "24000"))
        player = Playback()
        async for chunk in resp.aiter_bytes():
            if not chunk:
                continue
            now = time.perf_counter()
            if ttfp is None:
                ttfp = now - t0
            player.receive(len(chunk) / 2 / rate, now)  # 16-bit mono pcm
            num_bytes += len(chunk)
    return RequestResult(True, time.perf_counter() - t0, ttfp=ttfp, ttfa=ttfp, audio_seconds=num_bytes / 2 / rate,
                         underruns=player.underruns)


async def chat(client: httpx.AsyncClient, row: dict, opt: TaskOptions) -> RequestResult:
    body = {"messages": [{"role": "user", "content": row["prompt"]}], "stream": True,
            "max_tokens": opt.max_tokens, **opt.extra_body}
    if opt.model:
        body["model"] = opt.model
    t0 = time.perf_counter()
    ttft, ttfa, tokens, audio_bytes = None, None, 0, 0
    player = Playback()  # of the spoken answer (16-bit mono pcm at 24 kHz), when there is one
    async with client.stream("POST", "/v1/chat/completions", json=body) as resp:
        if resp.status_code != 200:
            await resp.aread()
            return RequestResult(False, time.perf_counter() - t0, error=_error(resp))
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            delta = json.loads(line[6:])["choices"][0].get("delta", {})
            if (delta.get("content") or delta.get("audio")) and ttft is None:
                ttft = time.perf_counter() - t0
            tokens += bool(delta.get("content"))
            if delta.get("audio", {}).get("data"):
                num_bytes, now = len(base64.b64decode(delta["audio"]["data"])), time.perf_counter()
                ttfa = now - t0 if ttfa is None else ttfa
                player.receive(num_bytes / 2 / 24000, now)
                audio_bytes += num_bytes
    return RequestResult(True, time.perf_counter() - t0, ttfp=ttft, ttfa=ttfa, tokens=tokens,
                         audio_seconds=audio_bytes / 2 / 24000, underruns=player.underruns)


TASKS = {"t2i": t2i, "edit": edit, "t2v": t2v, "tts": tts, "chat": chat}
