"""A real local Ray cluster of two nodes, started once per session and stopped at the end.

`ray start --head` and `ray start --address ...` run as two `--block` processes on this
machine, each in its own session. The head offers custom resource `node_a`, the other node
`node_b`, so a test pins an actor to a node by asking for one of them. Start-up is bounded
(`START_TIMEOUT_S`); teardown kills both processes and everything they started, by pid.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

NODE_CPUS = 4  # per node: room for the stage and worker actors of one test (the machine has fewer cores)
START_TIMEOUT_S = 90.0
RAY_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_node(args: list[str], log: Path) -> subprocess.Popen:
    ray_cli = Path(sys.executable).with_name("ray")
    with open(log, "wb") as out:
        return subprocess.Popen([str(ray_cli), "start", "--block", "--node-ip-address=127.0.0.1",
                                 f"--num-cpus={NODE_CPUS}", "--disable-usage-stats", *args],
                                env={**os.environ, **RAY_ENV}, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


def _stop_nodes(nodes: list[subprocess.Popen]) -> None:
    """SIGKILL at once: the cluster is thrown away with its temp dir, and after a SIGTERM every
    Ray process (raylet, GCS, agents, workers) was still running 5 s later."""
    procs = []
    for node in nodes:
        try:
            parent = psutil.Process(node.pid)
            procs += [parent, *parent.children(recursive=True)]
        except psutil.NoSuchProcess:
            pass
    for proc in procs:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=5)
    for node in nodes:
        node.wait(timeout=5)


@pytest.fixture(scope="session")
def ray_cluster():
    """The cluster's address ("127.0.0.1:PORT"); this process has joined it."""
    import ray

    from omnistage.runtime import ray as ray_utils

    for name, value in RAY_ENV.items():
        os.environ.setdefault(name, value)
    temp_dir = Path(tempfile.mkdtemp(prefix="omr", dir="/tmp"))  # short: Ray's socket paths live under it
    address = f"127.0.0.1:{_free_port()}"
    nodes = [_start_node(["--head", f"--port={address.split(':')[1]}", "--include-dashboard=false", f"--temp-dir={temp_dir}",
                          "--resources", json.dumps({"node_a": 100})], temp_dir / "head.log")]
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                socket.create_connection(("127.0.0.1", int(address.split(":")[1])), timeout=1).close()
                break
            except OSError:
                assert nodes[0].poll() is None, (temp_dir / "head.log").read_text()
                assert time.monotonic() < deadline, "the Ray head did not start"
                time.sleep(0.2)
        nodes.append(_start_node([f"--address={address}", "--resources", json.dumps({"node_b": 100})],
                                 temp_dir / "worker.log"))
        ray_utils.ensure_ray(address)
        while len([n for n in ray.nodes() if n["Alive"]]) < 2:
            assert nodes[1].poll() is None, (temp_dir / "worker.log").read_text()
            assert time.monotonic() < deadline, "the second Ray node did not join"
            time.sleep(0.2)
        yield address
    finally:
        ray.shutdown()
        _stop_nodes(nodes)
        shutil.rmtree(temp_dir, ignore_errors=True)
