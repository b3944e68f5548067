"""Routes of the LoRA adapter group; the handler comes from `app.state.lora_serving`."""

from __future__ import annotations

from fastapi import APIRouter, Depends, FastAPI, Request

from omnistage.entrypoints.openai.json_body import JSONBodyRoute
from omnistage.entrypoints.openai.lora.protocol import LoadLoraAdapterRequest, LoraAdapterList
from omnistage.entrypoints.openai.lora.serving import LoraServing

router = APIRouter(route_class=JSONBodyRoute)


def serving(request: Request) -> LoraServing:
    return request.app.state.lora_serving


@router.get("/v1/lora_adapters")
async def list_adapters(handler: LoraServing = Depends(serving)) -> LoraAdapterList:
    return await handler.list()


@router.post("/v1/lora_adapters")
async def load_adapter(body: LoadLoraAdapterRequest, handler: LoraServing = Depends(serving)) -> LoraAdapterList:
    return await handler.load(body)


@router.delete("/v1/lora_adapters/{name}")
async def unload_adapter(name: str, handler: LoraServing = Depends(serving)) -> LoraAdapterList:
    return await handler.unload(name)


def attach_router(app: FastAPI) -> None:
    app.include_router(router)
