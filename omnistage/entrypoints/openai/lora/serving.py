"""LoRA adapters over the engine (`AsyncOmni.list_lora_adapters`, `load_lora_adapter`,
`unload_lora_adapter`)."""

from __future__ import annotations

from typing import Any

from omnistage.entrypoints.openai.errors import APIError, from_value_error
from omnistage.entrypoints.openai.lora.protocol import LoadLoraAdapterRequest, LoraAdapter, LoraAdapterList


class LoraServing:
    def __init__(self, engine: Any):
        self.engine = engine

    async def list(self) -> LoraAdapterList:
        self._check_engine()
        return LoraAdapterList(data=[LoraAdapter(**a) for a in await self.engine.list_lora_adapters()])

    async def load(self, body: LoadLoraAdapterRequest) -> LoraAdapterList:
        await self._run(self.engine.load_lora_adapter, body.name, body.path)
        return await self.list()

    async def unload(self, name: str) -> LoraAdapterList:
        await self._run(self.engine.unload_lora_adapter, name)
        return await self.list()

    async def _run(self, method: Any, *args: Any) -> None:
        self._check_engine()
        try:
            await method(*args)
        except ValueError as e:  # a bad file or name: nothing changed
            raise from_value_error(e) from None
        except RuntimeError as e:  # no room, an adapter in use, no stage that loads adapters
            raise APIError(409, str(e), code="lora_adapter_conflict") from None

    def _check_engine(self) -> None:
        if self.engine is None or not hasattr(self.engine, "list_lora_adapters"):
            raise APIError(501, "this engine serves no LoRA adapters", code="not_implemented")
