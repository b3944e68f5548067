"""Completions: each prompt (text or token ids) runs `n` times, choice index = prompt * n + sample.

The prompt goes to the entry AR stage as is (no chat template). An omni model answers
with its thinker's text alone. `echo` prepends a text prompt to its choices; `suffix`
(fill-in-the-middle) is refused by name. `best_of` > n samples best_of per prompt and
returns the n with the highest total logprob (not streamed, as in vLLM).
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

from omnistage.entrypoints.openai.capabilities import Capabilities
from omnistage.entrypoints.openai.chat.protocol import Usage
from omnistage.entrypoints.openai.common import check_n
from omnistage.entrypoints.openai.completions.protocol import Completion, CompletionChoice, CompletionRequest
from omnistage.entrypoints.openai.engine_client import EngineGateway, RequestStream, cancel_on_disconnect, new_request_id
from omnistage.entrypoints.openai.errors import APIError, bad_request
from omnistage.entrypoints.openai.settings import ServerSettings
from omnistage.entrypoints.openai.text_generation import (
    choice_params,
    collect_all,
    completion_logprobs,
    entry_sampling_params,
    finish_reason,
    merge_streams,
    open_streams,
    prompt_tokens,
    usage,
    with_model_adapter,
)

_SAMPLING_FIELDS = ("temperature", "top_p", "stop", "seed", "max_tokens")


class CompletionServing:
    def __init__(self, gateway: EngineGateway, capabilities: Capabilities, settings: ServerSettings):
        self.gateway = gateway
        self.capabilities = capabilities
        self.settings = settings

    async def create(self, body: CompletionRequest, request: Any) -> Completion | AsyncIterator[str]:
        self.capabilities.require("completions")
        body = await with_model_adapter(body, self.settings, self.gateway.engine)
        prompts = _prompts(body.prompt)
        best_of = body.best_of or body.n
        if best_of < body.n:
            raise bad_request(f"best_of: must be >= n ({body.n}), got {best_of}", param="best_of")
        if best_of > body.n and body.stream:
            raise bad_request("best_of: ranking samples needs them finished; not with stream", param="best_of")
        check_n(best_of * len(prompts), self.settings)
        if body.suffix is not None:
            raise bad_request("suffix: fill-in-the-middle is not supported", param="suffix")
        if body.echo and any(not isinstance(p, str) for p in prompts):
            raise bad_request("echo: only with text prompts (token-id prompts have no text here)", param="echo")
        if body.echo and body.logprobs is not None:
            raise bad_request("echo: with logprobs it needs the prompt's logprobs, which are not supported",
                              param="echo")
        values = {k: getattr(body, k) for k in _SAMPLING_FIELDS}
        values["logprobs"] = body.logprobs
        values["lora"] = body.lora
        # max_tokens left out: the deploy's default, else OpenAI's 16 (SamplingParams'); null: until
        # the model stops, unless the deploy sets one.
        given = "max_tokens" in body.model_fields_set
        values["max_tokens"] = body.max_tokens if given else None
        params = entry_sampling_params(values, body.extras(), fallback={"max_tokens": None} if given else None)
        if best_of > body.n and params.logprobs is None:  # ranking reads each sample's logprobs
            params = params.replace(logprobs=0)
        entry = self.gateway.engine.spec.entry_stages[0].name
        jobs = [(_inputs(p), {entry: q}) for p in prompts for q in choice_params(params, best_of)]
        echoes = [p if body.echo else "" for p in prompts for _ in range(body.n)]
        request_id = new_request_id("cmpl")
        if body.stream:
            streams = await open_streams(self.gateway, jobs, request_id, ("text",), body.user)
            return self._sse(streams, body, request_id, echoes)

        async def go() -> Completion:
            streams = await open_streams(self.gateway, jobs, request_id, ("text",), body.user)
            samples = await collect_all(streams)
            return self._complete(_best(samples, best_of, body.n), body, request_id, echoes,
                                  usage_of=samples, group=best_of)

        return await cancel_on_disconnect(request, go())

    def _usage(self, outs: list[Any], n: int) -> Usage:
        # Each prompt counts once, however many samples it has.
        return Usage(**usage(outs, [prompt_tokens(outs[i]) for i in range(0, len(outs), n)]))

    def _complete(self, outs: list[Any], body: CompletionRequest, request_id: str, echoes: list[str],
                  usage_of: list[Any], group: int) -> Completion:
        choices = [CompletionChoice(index=i, text=echoes[i] + (out.text or ""), finish_reason=finish_reason(out),
                                    logprobs=completion_logprobs(out.logprobs) if body.logprobs is not None else None)
                   for i, out in enumerate(outs)]
        # Usage counts every sample made, best_of ones included (as OpenAI bills them).
        return Completion(id=request_id, created=int(time.time()), model=self.settings.served_model_name,
                          choices=choices, usage=self._usage(usage_of, group))

    async def _sse(self, streams: list[RequestStream], body: CompletionRequest, request_id: str,
                   echoes: list[str]) -> AsyncIterator[str]:
        created, model = int(time.time()), self.settings.served_model_name

        def chunk(index: int, text: str, reason: str | None = None, logprobs: Any = None) -> str:
            return _sse_line({"id": request_id, "object": "text_completion", "created": created, "model": model,
                              "choices": [{"index": index, "text": text, "logprobs": logprobs,
                                           "finish_reason": reason}]})

        finals: list[Any] = [None] * len(streams)
        offsets = [len(e) for e in echoes]  # text_offset of each choice's next token
        try:
            for index, echo in enumerate(echoes):
                if echo:
                    yield chunk(index, echo)
            async for index, out in merge_streams(streams):
                logprobs = None
                if body.logprobs is not None and out.logprobs_delta:
                    logprobs = completion_logprobs(out.logprobs_delta, offsets[index])
                    offsets[index] += sum(len(e.token) for e in out.logprobs_delta)
                if out.text_delta or logprobs:
                    yield chunk(index, out.text_delta or "", None, logprobs)
                if out.finished:
                    finals[index] = out
                    yield chunk(index, "", finish_reason(out))
            if body.stream_options is not None and body.stream_options.include_usage:
                yield _sse_line({"id": request_id, "object": "text_completion", "created": created, "model": model,
                                 "choices": [], "usage": self._usage(finals, body.n).model_dump()})
        except APIError as e:
            yield _sse_line(e.body())
        yield "data: [DONE]\n\n"


def _best(samples: list[Any], best_of: int, n: int) -> list[Any]:
    """Per prompt, the n samples of its best_of with the highest total logprob, best first."""
    if best_of == n:
        return samples
    chosen = []
    for start in range(0, len(samples), best_of):
        group = samples[start:start + best_of]
        group.sort(key=lambda out: sum(lp.logprob for lp in out.logprobs or []), reverse=True)
        chosen.extend(group[:n])
    return chosen


def _prompts(prompt: Any) -> list[str | list[int]]:
    """The body's prompt as a list of prompts (a list of ints is one token-id prompt)."""
    if isinstance(prompt, str):
        return [prompt]
    if not prompt:
        raise bad_request("prompt: is empty", param="prompt")
    if all(isinstance(p, int) for p in prompt):
        return [list(prompt)]
    return list(prompt)


def _inputs(prompt: str | list[int]) -> dict[str, Any]:
    return {"prompt": prompt} if isinstance(prompt, str) else {"prompt_token_ids": prompt}


def _sse_line(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"
