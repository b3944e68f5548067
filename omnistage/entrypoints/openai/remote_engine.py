"""`RemoteEngine`: the engine client of an API server process (`--api-server-count` > 1).

It has the surface the routes use (engine_client.EngineClient, plus sleep, weights and LoRA
calls) and forwards every call to the `AsyncOmni` in the engine process over an rpc pipe
(runtime/rpc.py); outputs come back through shared memory as raw buffers, so the encoding
of answers (PNG, base64, JSON, audio) runs here, in this process, not on the engine's loop.

`ENGINE_CALLS` and `ENGINE_STREAMS` are what the engine process serves: nothing else of the
engine can be reached from an API server. The engine's own metrics (stage histograms) live in
the engine process; `sync_metrics` copies them into this server's registry before /metrics
renders it, beside this process's HTTP metrics.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from omnistage.runtime.rpc import RpcClient

ENGINE_CALLS = ("abort", "check", "update", "check_health", "sleep", "wake_up", "update_weights",
                "list_lora_adapters", "load_lora_adapter", "unload_lora_adapter", "engine_metrics")
ENGINE_STREAMS = ("generate",)
ENGINE_STATE = ("sleep_level",)


def engine_metrics(registry: CollectorRegistry) -> str:
    """The engine process's side of `sync_metrics`: its registry as Prometheus text."""
    return generate_latest(registry).decode()


class _EngineMetrics:
    """A collector that replays the engine's metrics as last fetched."""

    def __init__(self):
        self.families: list[Any] = []

    def collect(self) -> list[Any]:
        return self.families


class RemoteEngine:
    def __init__(self, rpc: RpcClient, spec: Any, config: Any, registry: CollectorRegistry):
        self.rpc = rpc
        self.spec = spec
        self.config = config
        """The engine's merged deploy config (request defaults and model facts read it)."""
        self._metrics = _EngineMetrics()
        registry.register(self._metrics)

    @property
    def sleep_level(self) -> int | None:
        return self.rpc.state.get("sleep_level")

    @property
    def is_sleeping(self) -> bool:
        return self.sleep_level is not None

    def generate(self, prompt: Any, params: Any = None, request_id: str | None = None, *,
                 modalities: Sequence[str] | None = None, session_id: str | None = None) -> AsyncIterator[Any]:
        return self.rpc.stream("generate", prompt, params, request_id, modalities=modalities, session_id=session_id)

    async def check(self, prompt: Any, params: Any = None, request_id: str | None = None, *,
                    modalities: Sequence[str] | None = None) -> None:
        await self.rpc.call("check", prompt, params, request_id, modalities=modalities)

    async def abort(self, request_id: str) -> None:
        if not self.rpc.lost:  # a lost engine holds no requests any more
            await self.rpc.call("abort", request_id)

    async def update(self, request_id: str, inputs: dict) -> None:
        await self.rpc.call("update", request_id, inputs)

    async def check_health(self) -> bool:
        return not self.rpc.lost and bool(await self.rpc.call("check_health"))

    async def sleep(self, level: int = 1, timeout_s: float = 300.0) -> int:
        return await self.rpc.call("sleep", level, timeout_s)

    async def wake_up(self) -> None:
        await self.rpc.call("wake_up")

    async def update_weights(self, stage: str | int, path: str | None = None, *, tensors: Any = None,
                             timeout_s: float = 300.0) -> int:
        return await self.rpc.call("update_weights", stage, path, tensors=tensors, timeout_s=timeout_s)

    async def list_lora_adapters(self) -> list[dict]:
        return await self.rpc.call("list_lora_adapters")

    async def load_lora_adapter(self, name: str, path: str) -> None:
        await self.rpc.call("load_lora_adapter", name, path)

    async def unload_lora_adapter(self, name: str) -> None:
        await self.rpc.call("unload_lora_adapter", name)

    async def sync_metrics(self) -> None:
        text = await self.rpc.call("engine_metrics")
        self._metrics.families = list(text_string_to_metric_families(text))

    async def shutdown(self) -> None:
        """Nothing to stop here: the engine belongs to the engine process."""
        self.rpc.close()
