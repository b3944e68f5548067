"""runtime/service.py: a service process (an API server) under the stages' Supervisor: its
pipe is handed over once it is ready, a failed start says why, and a killed one is rebuilt."""

from __future__ import annotations

import os
import signal
import time

import pytest

from omnistage.runtime import process
from omnistage.runtime.service import ServiceEndpoint
from omnistage.runtime.supervisor import RestartPolicy, Supervisor


def echo(conn, fail: bool) -> None:
    """A service: ready, then answers each message until its pipe closes."""
    process.prepare_child()
    if fail:
        conn.send(("init_error", "no such model"))
        return
    conn.send(("ready", os.getpid()))
    try:
        while True:
            conn.send(("echo", conn.recv()))
    except EOFError:
        pass


def supervised(fail: bool = False, max_restarts: int = 3) -> tuple[Supervisor, list]:
    ready = []

    def build(generation: int) -> ServiceEndpoint:
        return ServiceEndpoint(f"svc-{generation}", echo, (fail,), on_ready=ready.append, stop_timeout_s=5)

    return Supervisor("svc", build, RestartPolicy(max_restarts=max_restarts, backoff_s=0.05)), ready


def test_a_killed_service_is_rebuilt_and_hands_over_its_new_pipe():
    sup, ready = supervised()
    try:
        sup.wait_ready(60)
        [conn] = ready
        conn.send("hi")
        assert conn.recv() == ("echo", "hi")  # the pipe is the service's own from "ready" on
        first = sup.endpoint.pid
        os.kill(first, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while len(ready) < 2:
            assert time.monotonic() < deadline, f"not rebuilt: {sup.state}, {sup.down_reason}"
            sup.step()
            time.sleep(0.05)
        sup.step()  # adopt the rebuilt endpoint
        assert sup.state == "serving" and sup.num_restarts == 1
        assert sup.endpoint.pid not in (None, first)
        ready[1].send("again")
        assert ready[1].recv() == ("echo", "again")
    finally:
        sup.close()


def test_a_service_that_fails_to_start_says_why():
    sup, ready = supervised(fail=True)
    try:
        with pytest.raises(RuntimeError, match="svc-0 failed to start:\nno such model"):
            sup.wait_ready(60)
        assert ready == []
    finally:
        sup.close()
