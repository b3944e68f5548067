"""The load generator against a small fake OpenAI server on localhost."""

import asyncio
import json
import socket
import threading
import time

import pytest
import uvicorn
from fastapi import FastAPI
from fastapi.responses import JSONResponse, StreamingResponse

from omnistage.bench.datasets import file_prompts, random_prompts
from omnistage.core.playback import Playback
from omnistage.bench.report import format_table, summarize, write_plots
from omnistage.bench.runner import BenchConfig, run_benchmark
from omnistage.bench.tasks import TaskOptions
from omnistage.entrypoints.cli import main


def _fake_app() -> FastAPI:
    app = FastAPI()

    @app.post("/v1/images/generations")
    async def images(body: dict):
        if body["prompt"].startswith("fail"):
            return JSONResponse(status_code=400, content={"error": {"message": "prompt: bad", "type": "x",
                                                                    "param": "prompt", "code": None}})
        await asyncio.sleep(0.02)
        return {"created": 0, "data": [{"b64_json": "AA=="}] * body.get("n", 1)}

    @app.post("/v1/audio/speech")
    async def speech(body: dict):
        gap = 0.15 if body["input"].startswith("slow") else 0.01  # "slow": each 0.1 s chunk comes 0.15 s later

        async def gen():
            for _ in range(4):
                await asyncio.sleep(gap)
                yield b"\x00\x00" * 2400  # 0.1 s at 24 kHz
        return StreamingResponse(gen(), media_type="audio/pcm", headers={"x-sample-rate": "24000"})

    return app


@pytest.fixture(scope="module")
def fake_server():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    server = uvicorn.Server(uvicorn.Config(_fake_app(), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 10
    while not server.started and time.time() < deadline:
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=5)


def test_t2i_counts_latency_and_errors(fake_server):
    prompts = random_prompts(6) + [{"prompt": "fail please"}]
    run = run_benchmark(BenchConfig(base_url=fake_server, task="t2i", prompts=prompts, options=TaskOptions(),
                                    max_concurrency=3, warmup=1, show_progress=False))
    s = summarize(run)
    assert s["completed"] == 6 and s["errors"] == 1
    assert s["first_errors"] == ["prompt: bad"]
    assert s["latency_p50_s"] >= 0.02 and s["images_per_s"] > 0
    assert "latency p95" in format_table(s)


def test_tts_measures_time_to_first_packet(fake_server):
    run = run_benchmark(BenchConfig(base_url=fake_server, task="tts", prompts=random_prompts(4),
                                    options=TaskOptions(), max_concurrency=2, warmup=0, show_progress=False))
    s = summarize(run)
    assert s["errors"] == 0
    assert 0 < s["ttfp_p50_s"] < s["latency_p50_s"]
    assert s["audio_seconds_per_s"] == pytest.approx(4 * 0.4 / s["duration_s"])
    assert s["rtf_mean"] > 0
    assert s["underruns"] == 0 and s["streams_with_underruns"] == 0  # 0.1 s of audio every 0.01 s
    assert "player underruns" in format_table(s)


def test_tts_counts_the_stalls_of_a_player_that_plays_each_stream_in_real_time(fake_server):
    run = run_benchmark(BenchConfig(base_url=fake_server, task="tts", prompts=[{"prompt": "slow one"}, {"prompt": "ok"}],
                                    options=TaskOptions(), max_concurrency=2, warmup=0, show_progress=False))
    s = summarize(run)
    [slow] = [r for r in run.results if len(r.underruns)]
    assert len(slow.underruns) == 3 and all(0.03 < u < 0.2 for u in slow.underruns)  # ~0.05 s before chunks 2-4
    assert s["underruns"] == 3 and s["streams_with_underruns"] == 1 and s["underrun_p99_s"] > 0.09


def test_the_player_stalls_only_when_the_audio_it_has_ran_out():
    player = Playback()
    assert not player.ahead(10.0)
    assert player.receive(1.0, now=10.0) == 0.0  # plays until 11
    assert player.receive(0.5, now=10.9) == 0.0 and player.ahead(11.4)  # in time: until 11.5
    assert player.receive(0.5, now=11.7) == pytest.approx(0.2)  # 0.2 s late
    player.receive(1.0, now=11.8)
    assert player.underruns == pytest.approx([0.2]) and not player.ahead(13.3)


def test_request_rate_spreads_arrivals(fake_server):
    run = run_benchmark(BenchConfig(base_url=fake_server, task="t2i", prompts=random_prompts(5),
                                    options=TaskOptions(), max_concurrency=8, request_rate=20.0, warmup=0,
                                    show_progress=False))
    assert summarize(run)["completed"] == 5


def test_cli_writes_json_and_plots(fake_server, tmp_path, capsys):
    out = tmp_path / "r.json"
    rc = main(["bench", "serve", "--base-url", fake_server, "--task", "t2i", "--num-prompts", "4",
               "--max-concurrency", "1,2", "--output-json", str(out), "--plot", str(tmp_path / "plots")])
    assert rc == 0
    runs = json.loads(out.read_text())["runs"]
    assert [r["max_concurrency"] for r in runs] == [1, 2]
    assert (tmp_path / "plots" / "latency_cdf.png").stat().st_size > 0
    assert "requests/s" in capsys.readouterr().out


def test_cli_rejects_bad_extra_body(capsys):
    assert main(["bench", "serve", "--task", "t2i", "--extra-body", "[1]"]) == 2
    assert "--extra-body" in capsys.readouterr().err


def test_file_prompts(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "a"}\n\n{"prompt": "b", "seed": 3}\n')
    assert file_prompts(f, 3) == [{"prompt": "a"}, {"prompt": "b", "seed": 3}, {"prompt": "a"}]
    f.write_text('{"text": "a"}\n')
    with pytest.raises(ValueError, match="p.jsonl:1"):
        file_prompts(f, 1)
