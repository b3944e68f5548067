"""`omnistage serve --api-server-count N` (N > 1): N API server processes over one engine.

The engine (`AsyncOmni`: the orchestrator and its stages) stays in the `omnistage serve`
process; it listens on nothing itself. That process binds the port once and spawns N API
server processes that inherit the listening socket: each runs the same FastAPI app
(`create_app`) over a `RemoteEngine` that talks to the engine through an rpc pipe
(runtime/rpc.py). The kernel hands each new connection to whichever process accepts it
first, so a process busy encoding an answer (PNG, base64, JSON) takes fewer. One shared
socket rather than SO_REUSEPORT: a port-hash would send connections to a busy process too,
and a restarted process needs no new bind.

- A dead API server process is rebuilt by a `Supervisor` (runtime/supervisor.py), with the
  stages' restart policy and backoff; the engine cancels what it held for it (its streams,
  and so their engine requests), and the other processes serve meanwhile.
- A dead engine process takes the server down: every API server sees its pipe close, fails
  what is in flight with 503 and exits. The stages in it are already restarted one by one
  by their own supervisors; a death of the process itself is a bug of ours, and a fresh
  start (by systemd, Kubernetes...) is the honest way back.
- SIGINT or SIGTERM: the API servers get SIGTERM and drain as one server does
  (`--graceful-timeout`), then the engine stops.
- Each answer carries `x-omnistage-api-server: <pid>` of the process that sent it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import shutil
import signal
import socket
import tempfile
import threading
from multiprocessing.connection import wait
from typing import Any

from omnistage.runtime import process
from omnistage.runtime.rpc import RpcClient, RpcHost
from omnistage.runtime.service import ServiceEndpoint
from omnistage.runtime.supervisor import RestartPolicy, Supervisor

logger = logging.getLogger(__name__)

READY_TIMEOUT_S = 300.0
"""Longest an API server process may take to import and build its app."""


def bind(host: str, port: int) -> socket.socket:
    """The listening socket every API server process accepts on."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


class EngineService:
    """What the engine process serves to API servers: the engine's own calls (the names in
    remote_engine.ENGINE_CALLS), plus its metrics as text."""

    def __init__(self, engine: Any):
        self.engine = engine

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    def engine_metrics(self) -> str:
        from omnistage.entrypoints.openai.remote_engine import engine_metrics

        return engine_metrics(self.engine.metrics_registry)


class APIServers:
    """The engine process's side: N supervised API server processes, one rpc host."""

    def __init__(self, engine: Any, settings: Any, count: int, sock: socket.socket, uvicorn_options: dict,
                 policy: RestartPolicy):
        from omnistage.entrypoints.openai.remote_engine import ENGINE_CALLS, ENGINE_STATE, ENGINE_STREAMS

        from omnistage.entrypoints.openai.api_server import EngineFacts

        self.host = RpcHost(EngineService(engine), ENGINE_CALLS, ENGINE_STREAMS, ENGINE_STATE)
        self._engine = engine
        # Worked out here, once: an API server process that never imports torch starts in a
        # fraction of the time.
        self._facts = EngineFacts.of(settings, engine)
        self._settings = settings
        self._sock = sock
        self._uvicorn_options = uvicorn_options
        self._loop = asyncio.get_running_loop()
        self._stopping = threading.Event()
        self.supervisors: list[Supervisor] = []
        try:
            self.supervisors = [Supervisor(f"api-server-{i}", self._builder(i), policy) for i in range(count)]
            for sup in self.supervisors:  # they start side by side; wait for each
                sup.wait_ready(READY_TIMEOUT_S)
        except BaseException:
            for sup in self.supervisors:
                sup.close()
            raise
        self._watcher = threading.Thread(target=self._watch, name="omnistage-api-servers", daemon=True)
        self._watcher.start()

    def _builder(self, index: int) -> Any:
        def build(generation: int) -> ServiceEndpoint:
            prefix = f"omnistage-api-{os.getpid()}-{index}-{generation}-"
            args = (prefix, self._sock, self._settings, self._engine.spec, self._engine.config, self._facts,
                    self._uvicorn_options)
            grace = self._uvicorn_options.get("timeout_graceful_shutdown") or 0

            def on_ready(conn: Any) -> None:  # called on the supervisor's thread; the host lives on the loop
                self._loop.call_soon_threadsafe(self.host.attach, conn, prefix)

            return ServiceEndpoint(f"api-server-{index}", api_server_main, args, on_ready=on_ready,
                                   stop_timeout_s=grace + 5.0)
        return build

    def _watch(self) -> None:
        """Step the supervisors whenever a process ends (they rebuild it)."""
        while not self._stopping.is_set():
            objects = [obj for sup in self.supervisors for obj in sup.wait_objects()]
            wait(objects, timeout=1.0)
            if self._stopping.is_set():
                return
            for sup in self.supervisors:
                sup.step()

    async def close(self) -> None:
        """Drain and stop the API servers (in parallel), then drop their pipes."""
        self._stopping.set()
        await asyncio.to_thread(self._watcher.join, 5.0)
        await asyncio.gather(*(asyncio.to_thread(sup.close) for sup in self.supervisors))
        self.host.close()


async def serve(engine: Any, settings: Any, host: str, port: int, uvicorn_options: dict,
                policy: RestartPolicy) -> None:
    """Run `settings.api_server_count` API servers until SIGINT or SIGTERM (the engine
    process's main coroutine). Without `files_dir` they share one temporary folder."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    temporary = settings.files_dir is None
    if temporary:
        settings = dataclasses.replace(settings, files_dir=tempfile.mkdtemp(prefix="omnistage-files-"))
    try:
        with bind(host, port) as sock:
            servers = APIServers(engine, settings, settings.api_server_count, sock, uvicorn_options, policy)
            try:
                await stop.wait()
            finally:
                await servers.close()
    finally:
        if temporary:
            shutil.rmtree(settings.files_dir, ignore_errors=True)


# --- the API server process ---------------------------------------------------------------

def api_server_main(conn: Any, prefix: str, sock: socket.socket, settings: Any, spec: Any, config: Any,
                    facts: Any, uvicorn_options: dict) -> None:
    """Body of an API server process: the app over a `RemoteEngine`, on the shared socket."""
    process.prepare_child()
    # Out of the terminal's process group: Ctrl-C reaches the engine process alone, which stops
    # the API servers in order (one that stopped by itself first would be restarted).
    os.setpgrp()
    asyncio.run(_serve_app(conn, prefix, sock, settings, spec, config, facts, uvicorn_options))


async def _serve_app(conn: Any, prefix: str, sock: socket.socket, settings: Any, spec: Any, config: Any,
                     facts: Any, uvicorn_options: dict) -> None:
    import uvicorn
    from prometheus_client import CollectorRegistry

    from omnistage.entrypoints.openai.api_server import create_app
    from omnistage.entrypoints.openai.draining_server import DrainingServer
    from omnistage.entrypoints.openai.middleware import ServerIdMiddleware
    from omnistage.entrypoints.openai.remote_engine import RemoteEngine

    server: DrainingServer | None = None

    def engine_lost() -> None:
        logger.error("the engine process is gone: this API server stops")
        if server is not None:
            server.should_exit = True

    rpc = RpcClient(conn, prefix, on_lost=engine_lost)
    registry = CollectorRegistry()
    try:
        app = create_app(settings, RemoteEngine(rpc, spec, config, registry), registry, facts)
        app.add_middleware(ServerIdMiddleware)
    except BaseException:
        import traceback

        conn.send(("init_error", traceback.format_exc()))
        raise
    conn.send(("ready", os.getpid()))
    rpc.start()
    server = DrainingServer(uvicorn.Config(app, **uvicorn_options), app.state.gateway)
    await server.serve(sockets=[sock])
