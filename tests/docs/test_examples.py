"""Every shell and Python example of the docs runs, on the tiny zoo models.

The examples run in one scratch folder where the zoo checkpoints they name (`./tiny-z-image`,
...) are linked. Python blocks run in this process (`exec`, as `__main__`); shell blocks made
only of `omnistage` commands run through the CLI's `main` in this process too (the console
script's own code, without paying a new interpreter's imports each time); any other shell
block runs in bash with `set -euo pipefail`, and its `curl` fails on an HTTP error. Examples
that talk to 127.0.0.1:8000 go to one shared server, started once from the block marked
`docs-test: server` (the demo: `omnistage serve`) on a free port. The server starts in the
background when the module starts, so the in-process examples run while it loads. The last
tests check that demo itself (a process of its own, test_cli_serve_demo.py's until it moved
here to share this one): its cheap defaults, what it prints, and a clean exit on Ctrl-C.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from doc_blocks import ROOT, RUN_LANGS, blocks

ZOO_CACHE = ROOT / ".omnistage-cache" / "zoo"
# The folders the examples name, and the zoo model each one is.
TINY = {
    "tiny-z-image": "z-image",
    "tiny-wan": "wan-t2v",
    "tiny-stable-audio": "stable-audio",
    "tiny-qwen2": "qwen2-llm",
    "tiny-csm": "csm",
    "tiny-qwen-omni": "qwen2.5-omni",
}

ALL = blocks()
RUNNABLE = [b for b in ALL if b.lang in RUN_LANGS and b.mark != "skip"]
SERVER_BLOCKS = [b for b in RUNNABLE if b.mark == "server"]
# In-process examples first (in page order), then the server's, so the server loads meanwhile.
ORDERED = [b for b in RUNNABLE if not b.needs_server and b.mark != "server"] + \
          [b for b in RUNNABLE if b.needs_server or b.mark == "server"]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, zoo):
    work = tmp_path_factory.mktemp("docs-examples")
    text = "\n".join(b.code for b in RUNNABLE)
    for folder, name in TINY.items():
        if f"./{folder}" in text:
            (work / folder).symlink_to(zoo(name))
    # The demo server builds its model into $XDG_CACHE_HOME/omnistage/zoo: point that at the
    # suite's zoo, where the tiny Z-Image already is.
    (work / "xdg" / "omnistage").mkdir(parents=True)
    (work / "xdg" / "omnistage" / "zoo").symlink_to(ZOO_CACHE, target_is_directory=True)
    zoo("z-image")
    return work


def _env(work: Path) -> dict[str, str]:
    env = dict(os.environ, XDG_CACHE_HOME=str(work / "xdg"))
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


@pytest.fixture(scope="module", autouse=True)
def server(workdir):
    """The shared server, started from the docs' own `docs-test: server` command (port swapped)."""
    from remote_server import free_port

    commands = {b.code.strip() for b in SERVER_BLOCKS}
    assert len(commands) == 1, f"the server blocks name different commands: {commands}"
    argv = shlex.split(commands.pop(), comments=True)
    assert argv[:2] == ["omnistage", "serve"], argv
    port = free_port()
    log = open(workdir / "server.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "omnistage.entrypoints.cli", *argv[1:], "--port", str(port),
                             "--log-level", "warning"], cwd=workdir, env=_env(workdir),
                            stdout=log, stderr=subprocess.STDOUT)
    state = {"proc": proc, "port": port, "log": workdir / "server.log", "healthy": False}
    yield state
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    log.close()


def _wait_healthy(state, timeout: float = 240.0) -> None:
    import time

    import httpx

    deadline = time.time() + timeout
    while not state["healthy"]:
        if state["proc"].poll() is not None:
            pytest.fail(f"the docs' server exited with {state['proc'].returncode}:\n{state['log'].read_text()[-3000:]}")
        try:
            state["healthy"] = httpx.get(f"http://127.0.0.1:{state['port']}/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            pass
        if time.time() > deadline:
            pytest.fail(f"the docs' server was not healthy after {timeout} s:\n{state['log'].read_text()[-3000:]}")
        time.sleep(0.3)


def _with_port(code: str, port: int) -> str:
    return code.replace("127.0.0.1:8000", f"127.0.0.1:{port}").replace("localhost:8000", f"localhost:{port}")


def _is_cli_only(commands: list[str]) -> bool:
    return all(c.startswith("omnistage ") and not c.startswith("omnistage serve") for c in commands)


@pytest.mark.parametrize("block", ORDERED, ids=[b.id for b in ORDERED])
def test_example_runs(block, workdir, server, monkeypatch, capsys):
    if block.mark == "server":  # the fixture ran it: it must come up healthy
        _wait_healthy(server)
        return
    if block.needs_server:
        _wait_healthy(server)
    code = _with_port(block.code, server["port"])
    monkeypatch.chdir(workdir)
    if block.lang == "python":
        exec(compile(code, block.id, "exec"), {"__name__": "__main__"})
        return
    commands = block.commands()
    if _is_cli_only(commands):
        from omnistage.entrypoints.cli import main

        for command in commands:
            assert main(shlex.split(command, comments=True)[1:]) == 0, f"{block.id}: {command} failed"
        return
    script = 'set -euo pipefail\ncurl() { command curl --fail-with-body -sS "$@"; }\n' + code
    done = subprocess.run(["bash", "-c", script], cwd=workdir, env=_env(workdir), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, f"{block.id} exited {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"


def test_skipped_examples_say_why():
    skipped = [b for b in ALL if b.lang in RUN_LANGS and b.mark == "skip"]
    for block in skipped:
        assert block.reason, f"{block.id}: a skipped example needs a reason"
    # Sparingly: each skip is a GPU, another kind of model, a second machine or an install (17: the
    # duplex and live video chat routes' examples joined; they need a Moshi and an omni model,
    # tested in tests/entrypoints/openai).
    assert len(skipped) <= 17, [b.id for b in skipped]
    assert SERVER_BLOCKS, "no block starts the docs' server"


def test_yaml_examples_parse():
    for block in ALL:
        if block.lang in ("yaml", "yml"):
            yaml.safe_load(block.code)


def test_the_demo_answers_a_bare_request_with_its_cheap_defaults(server):
    """`omnistage serve` with no model serves the embedded tiny Z-Image with the demo's deploy
    defaults (the checkpoint's are 1024x1024 at 50 steps)."""
    import base64
    import io

    import httpx
    from PIL import Image

    _wait_healthy(server)
    url = f"http://127.0.0.1:{server['port']}"
    models = httpx.get(f"{url}/v1/models").json()
    assert models["object"] == "list" and models["data"][0]["id"].startswith("omnistage-demo")
    assert models["data"][0]["defaults"]["diffusion"]["num_inference_steps"] == 4
    resp = httpx.post(f"{url}/v1/images/generations", json={"prompt": "x"}, timeout=120)
    assert resp.status_code == 200, resp.text
    image = Image.open(io.BytesIO(base64.b64decode(resp.json()["data"][0]["b64_json"])))
    assert image.size == (256, 256)


def test_the_demo_said_where_it_serves_and_exits_0_on_ctrl_c(server):
    """Last: it stops the module's server."""
    _wait_healthy(server)
    server["proc"].send_signal(signal.SIGINT)
    assert server["proc"].wait(60) == 0
    out = server["log"].read_text()
    assert f"http://127.0.0.1:{server['port']}" in out
    assert "random" in out and "curl" in out  # the demo's noise is announced, with a request to try
