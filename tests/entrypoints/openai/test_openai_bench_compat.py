"""The benchmark client's tasks (omnistage.bench.tasks) against our routes: headers,
forms and SSE deltas stay compatible."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from fake_engine import FakeEngine

from omnistage.bench.tasks import TASKS, TaskOptions
from omnistage.entrypoints.openai.api_server import ServerSettings, create_app


@pytest.mark.parametrize("task, kind, check", [
    ("t2i", "image", lambda r: r.images == 1),
    ("edit", "image", lambda r: r.images == 1),
    ("t2v", "video", lambda r: r.frames == 5),
    ("tts", "tts", lambda r: r.audio_seconds == pytest.approx(2400 / 16000) and r.ttfp is not None),
    ("chat", "text", lambda r: r.tokens == 5 and r.ttfp is not None),
])
def test_bench_task_against_the_server(task, kind, check):
    app = create_app(ServerSettings(served_model_name="m", model_path="/m"), FakeEngine(kind))

    async def go():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await TASKS[task](client, {"prompt": "a cat"}, TaskOptions(model="m", size="16x16", frames=5))

    result = asyncio.run(go())
    assert result.ok, result.error
    assert check(result)
