"""What chat and completions share: sampling params from a body, `n` samples, usage, logprobs.

`n` > 1 is n engine requests of the same prompt (ids `<request_id>-<i>`), each with its
own seed (`seed + i` when the body has a seed, so a seeded request is reproducible).
The AR engine's prefix cache, where it has one, shares the prompt's KV between them.
The n streams are read concurrently and their outputs interleave in arrival order.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from omnistage.ar.sampling_params import SamplingParams
from omnistage.core.lora import LoraRequest
from omnistage.entrypoints.openai.common import check_model
from omnistage.entrypoints.openai.engine_client import EngineGateway, RequestStream
from omnistage.entrypoints.openai.errors import bad_request, from_value_error
from omnistage.entrypoints.openai.settings import ServerSettings

LOGPROB_FLOOR = -9999.0  # JSON has no -inf: tokens the grammar forbids get vLLM's floor value

_GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar"}


async def with_model_adapter(body: Any, settings: ServerSettings, engine: Any) -> Any:
    """vLLM's convention: a text request's `model` may name a LoRA adapter of the entry (AR) stage
    rather than the served model; then the body comes back with `lora: {"name": model}`. Any other
    model is a 404 (`check_model`). Only a name that is not the served model asks the engine."""
    requested = body.model
    if requested is None or requested in (settings.served_model_name, settings.model_path):
        return body
    entry = engine.spec.entry_stages[0]
    if entry.kind == "ar" and hasattr(engine, "list_lora_adapters"):
        served = {a["name"] for a in await engine.list_lora_adapters() if a["stage"] == entry.name}
        if requested in served:
            if body.lora is not None and body.lora.name != requested:
                raise bad_request(f"lora: names adapter {body.lora.name!r}, and model names adapter {requested!r}; "
                                  f"give one", param="lora")
            return body.model_copy(update={"lora": body.lora or LoraRequest(name=requested)})
    check_model(requested, settings)
    return body


def entry_sampling_params(values: dict[str, Any], extras: dict[str, Any],
                          fallback: dict[str, Any] | None = None) -> SamplingParams:
    """The entry (thinker) stage's params as the body gives them: `values` (its OpenAI fields,
    None = not given), then `extras` (vLLM's extra sampling fields at the top level, and its
    `guided_*` spellings of `structured_outputs`). Only the given fields are set: the engine
    fills the rest from the stage's deploy defaults, then from `fallback` (the route's own
    defaults), then from SamplingParams'."""
    given = {k: v for k, v in values.items() if v is not None}
    extras = dict(extras)
    guided = {_GUIDED[k]: extras.pop(k) for k in list(extras) if k in _GUIDED}
    if guided:
        if "structured_outputs" in extras:
            raise bad_request("give structured_outputs or guided_*, not both", param="structured_outputs")
        extras["structured_outputs"] = guided
    given.update(extras)
    try:
        params = SamplingParams.from_dict(given, fallback=fallback)
        if params.structured_outputs is not None:  # a grammar no engine can compile is a 400 before queueing
            params.structured_outputs.validate()
    except ValueError as e:  # RequestError(s) from SamplingParams and the grammar check, naming the field
        raise from_value_error(e) from None
    return params


def choice_params(params: SamplingParams, n: int) -> list[SamplingParams]:
    """One params per choice: choice i gets seed + i (unseeded stays unseeded)."""
    if n == 1:
        return [params]
    return [params.replace(seed=None if params.seed is None else params.seed + i) for i in range(n)]


async def open_streams(gateway: EngineGateway, jobs: list[tuple[Any, Any]], request_id: str,
                       modalities: Any = None, session_id: str | None = None) -> list[RequestStream]:
    """Open one engine request per (prompt, params) job, all submitted before any first
    output is awaited (so the engine batches them); if one is refused, close the others."""
    streams: list[RequestStream] = []
    try:
        for i, (prompt, params) in enumerate(jobs):
            rid = request_id if len(jobs) == 1 else f"{request_id}-{i}"
            streams.append(gateway.submit(prompt, params, rid, modalities, session_id))
        # Every start runs to its end (no stream is closed while its start is in flight).
        results = await asyncio.gather(*(s.start() for s in streams), return_exceptions=True)
        failure = next((r for r in results if isinstance(r, BaseException)), None)
        if failure is not None:
            raise failure
    except BaseException:
        for stream in streams:
            await stream.close()
        raise
    return streams


async def merge_streams(streams: list[RequestStream]) -> AsyncIterator[tuple[int, Any]]:
    """(index, output) from every stream as they come; closes them all when done or left."""
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(i: int, stream: RequestStream) -> None:
        try:
            async for out in stream:
                await queue.put((i, out))
            await queue.put((i, done))
        except BaseException as e:
            await queue.put((i, e))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(streams)
        while remaining:
            i, item = await queue.get()
            if item is done:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield i, item
    finally:
        for task in tasks:
            task.cancel()
        for stream in streams:
            await stream.close()


async def collect_all(streams: list[RequestStream]) -> list[Any]:
    """The finished output of every stream, in order."""
    finals: list[Any] = [None] * len(streams)
    async for i, out in merge_streams(streams):
        finals[i] = out
    return finals


def finish_reason(out: Any) -> str:
    return getattr(out, "finish_reason", None) or "stop"


def prompt_tokens(out: Any) -> int:
    metrics = getattr(out, "metrics", None) or {}
    return int(metrics.get("num_prompt_tokens") or 0)


def completion_tokens(out: Any) -> int:
    if out is None:
        return 0
    if out.token_ids is not None:
        return len(out.token_ids)
    stages = (getattr(out, "metrics", None) or {}).get("stages", {})  # an aborted request has no token ids
    return sum(int(m.get("num_generated_tokens") or 0) for m in stages.values())


def cached_tokens(out: Any, entry_stage: str) -> int:
    """Prompt tokens the entry stage read from its prefix cache (0 when it computed them all)."""
    stages = (getattr(out, "metrics", None) or {}).get("stages", {})
    return int((stages.get(entry_stage) or {}).get("num_cached_tokens") or 0)


def usage(outs: list[Any], prompt_counts: list[int] | None = None) -> dict[str, int]:
    """Usage over the finished outputs of one body's engine requests. `prompt_counts` gives
    each distinct prompt's count (n samples of one prompt count it once, as OpenAI does);
    by default the first output's."""
    prompt = sum(prompt_counts) if prompt_counts is not None else prompt_tokens(outs[0]) if outs else 0
    completion = sum(completion_tokens(o) for o in outs)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _lp(value: float) -> float:
    return max(value, LOGPROB_FLOOR)


def chat_logprobs(entries: list[Any] | None) -> dict[str, Any] | None:
    """OpenAI's chat `logprobs`: {"content": [{token, logprob, bytes, top_logprobs}]}."""
    if entries is None:
        return None
    return {"content": [{
        "token": e.token, "logprob": _lp(e.logprob), "bytes": list(e.token.encode()),
        "top_logprobs": [{"token": t, "logprob": _lp(lp), "bytes": list(t.encode())} for _, t, lp in e.top],
    } for e in entries], "refusal": None}


def completion_logprobs(entries: list[Any] | None, text_offset: int = 0) -> dict[str, Any] | None:
    """The completions API's `logprobs`: parallel lists of tokens, their logprobs, the top
    alternatives ({token: logprob}) and each token's character offset in the text."""
    if entries is None:
        return None
    offsets, pos = [], text_offset
    for e in entries:
        offsets.append(pos)
        pos += len(e.token)
    return {"tokens": [e.token for e in entries], "token_logprobs": [_lp(e.logprob) for e in entries],
            "top_logprobs": [{t: _lp(lp) for _, t, lp in e.top} for e in entries], "text_offset": offsets}
