"""`VLLMAREngine`: a plain text LLM stage run by vLLM (`ar_backend: vllm`), the `Engine` protocol.

    add_request -> our prompt rules (ARModel.build_prompt) -> vllm.LLMEngine.add_request(TokensPrompt)
    step():  vllm.LLMEngine.step()   one engine-core step: its new tokens and text, as deltas
             -> one StageOutput(TextPayload) per request that advanced (plus our aborts)

Only vLLM's public engine API is used (`EngineArgs`, `LLMEngine.from_engine_args`,
`add_request` / `step` / `abort_request`, `SamplingParams`, `TokensPrompt`); nothing in
vLLM is patched. vLLM runs its engine core and worker in processes of its own (spawned),
so a script that builds this engine needs the `if __name__ == "__main__":` guard.

Deploy fields map onto `EngineArgs`: `dtype` ("auto" is resolved by our rule: fp32 on
CPU, bf16 on GPU), `max_num_seqs`, `max_model_len`, `tensor_parallel_size`, and
`compile` (False = vLLM's `enforce_eager`), `enable_prefix_caching` and
`max_num_batched_tokens`. The KV cache is `kv_cache_memory` bytes, or by default sized
like the native engine's: room for `max_num_seqs` sequences of `max_model_len` tokens,
passed as `kv_cache_memory_bytes` (no `VLLM_CPU_KVCACHE_SPACE` needed; set, vLLM's
CPU platform lets it win). Request params are our `SamplingParams`, whose fields carry
vLLM's names and meanings, so they pass through one for one.

vLLM runs plain text LLMs only: a stage whose `StageSpec.model` names a family runner
(custom forwards, hidden states for a downstream stage) stays on the native engine, and
`return_hidden_states` / `return_input_embeds` are refused. `queue_time` is not
reported: the queue is inside vLLM, whose per-request stats stay off (they would start
vLLM's own loggers and Prometheus collectors).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from omnistage.ar.model import ARModel
from omnistage.ar.sampling_params import SamplingParams, admit
from omnistage.config.deploy_fields import StageDeployConfig
from omnistage.config.spec import StageSpec
from omnistage.core.device import resolve_device, resolve_dtype
from omnistage.core.errors import RequestError
from omnistage.core.types import StageOutput, StageRequest, TextPayload

logger = logging.getLogger(__name__)

INSTALL_HINT = (
    "ar_backend 'vllm' needs vLLM: pip install 'omnistage[vllm]'. On a CPU-only x86_64 machine, "
    "pip install torch==2.13.0 first, and afterwards pip uninstall -y torchvision torchaudio torchcodec "
    "(vLLM pulls registry builds of them that link CUDA libraries and break `import vllm`); vLLM's CPU "
    "attention needs head_dim >= 32. Or use ar_backend: native."
)

_NATIVE_ONLY_INPUTS = ("return_hidden_states", "return_input_embeds")
_UNSUPPORTED_FIELDS = ("quantization", "lora", "offload")  # deploy fields this backend cannot honour


class VLLMAREngine:
    def __init__(self, model_path: str, stage: StageSpec | None = None,
                 config: StageDeployConfig = StageDeployConfig()) -> None:
        check_backend_fits(stage, config)
        vllm = import_vllm()
        from omnistage.ar.hf_model import load_tokenizer

        self.stage = stage
        self.config = config
        self.default_params = SamplingParams.from_dict(dict(config.default_sampling_params))
        self._vllm = vllm
        # Prompts are built in this process by the native engine's rules, so both backends
        # feed the model the same token ids; vLLM gets them as a TokensPrompt.
        self.prompts = _PromptBuilder(load_tokenizer(model_path))
        started = time.monotonic()
        self.engine = vllm.LLMEngine.from_engine_args(engine_args(vllm, model_path, config),
                                                      enable_multiprocessing=True)
        self.max_model_len = self.engine.model_config.max_model_len
        logger.info("vLLM engine for %s started in %.1f s", model_path, time.monotonic() - started)
        self._requests: dict[str, _Request] = {}
        self._aborted: list[_Request] = []
        self._error: str | None = None
        self._closed = False

    # --- Engine protocol ---------------------------------------------------------------------

    def add_request(self, request: StageRequest) -> None:
        """Validate and hand a request to vLLM. Raises ValueError (naming the limit) when it cannot run."""
        rid = request.request_id
        if rid in self._requests:
            raise ValueError(f"request {rid!r} is already running")
        inputs = request.inputs
        if isinstance(inputs, dict) and any(inputs.get(k) for k in _NATIVE_ONLY_INPUTS):
            raise ValueError(f"request {rid!r}: {'/'.join(_NATIVE_ONLY_INPUTS)} need ar_backend 'native'; "
                             "vLLM returns tokens and text only")
        if isinstance(inputs, dict):
            inputs = {k: v for k, v in inputs.items() if k not in _NATIVE_ONLY_INPUTS}
        token_ids = self.prompts.build_prompt(inputs).token_ids
        num_prompt = len(token_ids)
        # vLLM needs room for at least one output token.
        params = admit(rid, request.params, self.default_params, num_prompt, self.max_model_len, min_output_tokens=1)
        self.engine.add_request(rid, self._vllm.TokensPrompt(prompt_token_ids=token_ids),
                                to_vllm_params(self._vllm, params))
        self._requests[rid] = _Request(rid, num_prompt, request.arrival_time)

    def abort_request(self, request_id: str) -> None:
        """Stop a request; its final output (finish_reason "abort") comes from the next step.
        Unknown ids are ignored."""
        req = self._requests.pop(request_id, None)
        if req is not None:
            self.engine.abort_request([request_id])
            self._aborted.append(req)

    def step(self) -> list[StageOutput]:
        outputs = [self._output(req, finish_reason="abort") for req in self._aborted]
        self._aborted.clear()
        # NOTE: vLLM's step blocks until its engine core sends the next outputs; with
        # nothing in flight it would wait forever, so only step when vLLM holds work.
        if not self.engine.has_unfinished_requests():
            return outputs
        try:
            stepped = self.engine.step()
        except Exception as exc:  # vLLM's engine core died: every request it held is lost
            logger.exception("vLLM engine step failed")
            self._error = f"{type(exc).__name__}: {exc}"
            failed, self._requests = list(self._requests.values()), {}
            return outputs + [self._output(req, finish_reason="abort", error=self._error) for req in failed]
        for result in stepped:
            req = self._requests.get(result.request_id)
            if req is None:
                continue  # aborted after vLLM produced it
            outputs.append(self._advance(req, result))
        return outputs

    def has_unfinished_requests(self) -> bool:
        return bool(self._requests) or bool(self._aborted)

    def is_healthy(self) -> bool:
        return not self._closed and self._error is None

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        # LLMEngine has no close(); its engine-core client does (vLLM's LLM class relies on
        # the same client's finalizer). It stops the engine-core and worker processes.
        self.engine.engine_core.shutdown()

    # --- outputs -------------------------------------------------------------------------------

    def _advance(self, req: _Request, result: Any) -> StageOutput:
        """Fold one vLLM delta (RequestOutputKind.DELTA) into the request's cumulative output."""
        completion = result.outputs[0]
        delta_ids = list(completion.token_ids)
        if delta_ids and req.first_token_time is None:
            req.first_token_time = time.monotonic()
        req.token_ids.extend(delta_ids)
        req.text += completion.text
        if not result.finished:
            return self._output(req, delta_ids, completion.text)
        self._requests.pop(req.request_id, None)
        reason = completion.finish_reason
        if reason in ("stop", "length", "abort"):
            return self._output(req, delta_ids, completion.text, finish_reason=reason)
        return self._output(req, delta_ids, completion.text, finish_reason="abort",
                            error=f"vLLM ended the request with finish_reason={reason!r}")

    @staticmethod
    def _output(req: _Request, delta_ids: Sequence[int] = (), delta_text: str = "", *,
                finish_reason: str | None = None, error: str | None = None) -> StageOutput:
        payload = TextPayload(token_ids=list(req.token_ids), text=req.text, delta_token_ids=list(delta_ids),
                              delta_text=delta_text, finish_reason=finish_reason)
        metrics = {"num_prompt_tokens": req.num_prompt_tokens, "num_generated_tokens": len(req.token_ids)}
        if req.first_token_time is not None:
            metrics["time_to_first_token"] = req.first_token_time - req.arrival_time
        return StageOutput(req.request_id, payload, finished=finish_reason is not None, error=error, metrics=metrics)


@dataclass
class _Request:
    """What we keep per request: vLLM streams deltas, the payload carries the totals."""
    request_id: str
    num_prompt_tokens: int
    arrival_time: float
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    first_token_time: float | None = None


class _PromptBuilder(ARModel):
    """`ARModel.build_prompt`'s rules (str, prompt, prompt_token_ids, messages + chat template)
    over the checkpoint's tokenizer. Never loaded or run: vLLM owns the model."""

    def __init__(self, tokenizer: Any) -> None:
        if tokenizer is None:
            raise ValueError("ar_backend 'vllm' runs text LLMs; this checkpoint has no tokenizer")
        self.tokenizer = tokenizer

    @classmethod
    def load(cls, *args: Any) -> ARModel:
        raise NotImplementedError("vLLM loads the model")

    def forward(self, batch: Any, cache: Any) -> Any:
        raise NotImplementedError("vLLM runs the model")


# --- configuration ---------------------------------------------------------------------------


def check_backend_fits(stage: StageSpec | None, config: StageDeployConfig) -> None:
    """Raise ValueError when the stage or its deploy fields need the native engine."""
    problems = []
    if stage is not None and stage.kind != "ar":
        problems.append(f"stage {stage.name!r} is a {stage.kind} stage; ar_backend applies to AR stages")
    if stage is not None and stage.model is not None:
        problems.append(f"stage {stage.name!r} runs the family model {stage.model!r} (custom forward, hidden "
                        "states for the next stage), which only ar_backend 'native' runs; vLLM runs plain text LLMs")
    problems += [f"{name}={getattr(config, name)!r} is not supported with ar_backend 'vllm'"
                 for name in _UNSUPPORTED_FIELDS if getattr(config, name)]
    if config.kv_cache_memory is not None and config.kv_cache_memory <= 1:
        problems.append(f"kv_cache_memory={config.kv_cache_memory!r}: with ar_backend 'vllm' give bytes, not a fraction")
    if problems:
        raise ValueError("ar_backend 'vllm': " + "; ".join(problems))


def import_vllm() -> Any:
    """The `vllm` package, or an ImportError that says how to install it."""
    try:
        import vllm
    except ImportError as exc:
        raise ImportError(f"{INSTALL_HINT} ({type(exc).__name__}: {exc})") from exc
    return vllm


def engine_args(vllm: Any, model_path: str, config: StageDeployConfig) -> Any:
    """`vllm.EngineArgs` from our deploy fields, with a KV cache sized like the native engine's
    (`kv_cache_memory` bytes when set, else max_num_seqs sequences of max_model_len tokens)."""
    device = resolve_device(config.devices)
    expected = [f"{device.type}:{i}" if device.type != "cpu" else "cpu" for i in range(config.tensor_parallel_size)]
    if config.devices and [_device_name(d) for d in config.devices] != expected:
        raise ValueError(f"ar_backend 'vllm': devices={list(config.devices)}, but vLLM places its workers on the "
                         f"first visible devices ({expected}); leave devices empty and choose GPUs with "
                         "CUDA_VISIBLE_DEVICES")
    args = vllm.EngineArgs(
        model=model_path,
        dtype=str(resolve_dtype(config.dtype, device)).removeprefix("torch."),
        max_model_len=config.max_model_len,
        max_num_seqs=config.max_num_seqs,
        tensor_parallel_size=config.tensor_parallel_size,
        enforce_eager=not config.compile,
        disable_log_stats=True,
        enable_prefix_caching=config.enable_prefix_caching,
        max_num_batched_tokens=config.max_num_batched_tokens,
    )
    if config.kv_cache_memory is not None:
        return dataclasses.replace(args, kv_cache_memory_bytes=int(config.kv_cache_memory))
    vllm_config = args.create_engine_config()
    return dataclasses.replace(args, kv_cache_memory_bytes=kv_cache_bytes(vllm_config, config.max_num_seqs))


def kv_cache_bytes(vllm_config: Any, max_num_seqs: int) -> int:
    """Per worker: K and V of every layer for `max_num_seqs` sequences of max_model_len tokens,
    in whole cache blocks (the model facts come from vLLM's reading of the checkpoint), plus
    the one block vLLM's block pool keeps aside as its null block."""
    model, parallel, cache = vllm_config.model_config, vllm_config.parallel_config, vllm_config.cache_config
    per_token = (2 * model.get_num_layers(parallel) * model.get_num_kv_heads(parallel)
                 * model.get_head_size() * model.dtype.itemsize)
    num_blocks = max_num_seqs * math.ceil(model.max_model_len / cache.block_size) + 1
    return num_blocks * cache.block_size * per_token


def to_vllm_params(vllm: Any, params: SamplingParams) -> Any:
    """Our SamplingParams carry vLLM's field names and meanings: pass every field through, and
    ask for deltas (we keep the totals)."""
    from vllm.sampling_params import RequestOutputKind

    values = {f.name: getattr(params, f.name) for f in dataclasses.fields(params)}
    if values.pop("logprobs") is not None:
        raise ValueError("logprobs: the vLLM backend does not return them yet; use the native backend")
    if values.pop("lora") is not None:
        raise RequestError("lora", "lora: the vLLM backend takes no per-request LoRA adapter yet; use the native "
                                   "backend (ar_backend: native)")
    structured = values.pop("structured_outputs")
    if structured is not None:
        from vllm.sampling_params import StructuredOutputsParams

        values["structured_outputs"] = StructuredOutputsParams(**{k: v for k, v in dataclasses.asdict(structured).items()
                                                                  if v is not None})
    return vllm.SamplingParams(**values, output_kind=RequestOutputKind.DELTA)


def _device_name(device: str) -> str:
    return "cuda:0" if device == "cuda" else device
