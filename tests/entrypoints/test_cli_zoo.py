"""`omnistage serve` with no model builds the demo into the user cache and answers."""

import base64
import io
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from PIL import Image


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.e2e
def test_serve_demo_answers_health_and_models(tmp_path, zoo):
    # Pre-seed the demo cache from the session zoo so the test does not rebuild it.
    cache = tmp_path / "cache"
    demo = zoo("z-image")
    target = cache / "omnistage" / "zoo" / demo.name
    target.parent.mkdir(parents=True)
    os.symlink(demo, target)

    port = _free_port()
    env = {**os.environ, "XDG_CACHE_HOME": str(cache)}
    proc = subprocess.Popen([sys.executable, "-m", "omnistage.entrypoints.cli", "serve", "--port", str(port)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.3)
            assert proc.poll() is None, proc.stdout.read()
        models = httpx.get(f"http://127.0.0.1:{port}/v1/models").json()
        assert models["object"] == "list" and models["data"][0]["id"].startswith("omnistage-demo")
        assert models["data"][0]["defaults"]["diffusion"]["num_inference_steps"] == 4
        # A bare request gets the demo's cheap defaults (the checkpoint's are 1024x1024, 50 steps).
        resp = httpx.post(f"http://127.0.0.1:{port}/v1/images/generations", json={"prompt": "x"}, timeout=120)
        assert resp.status_code == 200, resp.text
        image = Image.open(io.BytesIO(base64.b64decode(resp.json()["data"][0]["b64_json"])))
        assert image.size == (256, 256)
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
    assert f"http://127.0.0.1:{port}" in out
    assert "random" in out and "curl" in out
    assert proc.returncode == 0


def test_zoo_cli_lists_and_rejects_unknown(capsys):
    from omnistage.entrypoints.cli import main

    assert main(["zoo", "list"]) == 0
    assert "z-image" in capsys.readouterr().out
    assert main(["zoo", "build", "no-such-model", "/tmp/x-never"]) == 2
    assert "unknown zoo model" in capsys.readouterr().err
    assert not Path("/tmp/x-never").exists()
