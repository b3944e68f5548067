"""`AREngine`: continuous batching for autoregressive stages (the `Engine` protocol).

    add_request -> Scheduler.waiting
    step():  Scheduler.schedule()      which sequences run, how many tokens each (decodes, prompt
                                       chunks after their cached prefix), KV blocks; preemption
             ModelRunner.execute()     the decode and prefill forwards + sampling
             Scheduler.update()        computed tokens, prefix-cache blocks, append tokens,
                                       stop rules, free blocks
             -> one StageOutput(TextPayload) per sequence that got a token (or ended)

KV cache: paged (block_manager.py, kv_cache.py). Its size is the stage's
`kv_cache_memory` (bytes, or a fraction of the device's memory), by default room for
`max_num_seqs` sequences of `max_model_len` tokens; `enable_prefix_caching` (default on)
reuses cached blocks of a prompt's prefix; `max_num_batched_tokens` bounds the tokens
one step feeds, longer prompts being prefilled in chunks next to the running decodes.
`paged_attention` picks how attention reads the blocks: in place, by a kernel (CPU:
kernels/paged_attention.cpp; CUDA: kernels/paged_attention_triton.py), or gathered into one
tensor per row first (paged_attention.py).
`compile: true` (CUDA only) replays decode-only steps from CUDA graphs (cuda_graphs.py).
`lora_adapters` / `max_loras`: requests pick a peft LoRA adapter (`SamplingParams.lora`), by name
or loaded by path on first use (core/lora.py's LRU set); rows with different adapters share each
forward (lora.py).

Inputs (`StageRequest.inputs`) for the generic causal LM: a str, or a dict with one of
"prompt", "prompt_token_ids", "messages" (see `ARModel.build_prompt`). A dict may also
set "return_hidden_states" / "return_input_embeds" (bool) to get, per request, the
last-layer (final-norm) hidden states / input embeddings of every fed position: the
prompt, then each generated token but the last (it is never fed back, as in
transformers). Every output carries this step's rows, `[num_new_rows, hidden]`, in
`extras["delta_hidden_states"]` / `extras["delta_input_embeds"]` (the whole prompt at the
first output, then one row per token); the finished output also carries all rows in
`TextPayload.hidden_states` / `extras["input_embeds"]`. Unlike token ids and text they
are not repeated cumulatively on every output: a process stage would ship O(n^2) bytes.
Such requests use the prefix cache too: the rows of a cached block's positions are stored
beside its KV (block_states.py), so a hit still returns a row for every prompt position.
Tensors stay on the model's device. Engine-wide defaults come from the constructor.

The engine is driven by one caller: `add_request`, `abort_request` and `step` are not
meant to be called concurrently.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from omnistage.ar.block_manager import BlockManager
from omnistage.core.cpu_linear import prepack_linears
from omnistage.ar.detokenizer import IncrementalDetokenizer
from omnistage.ar.lora import AdapterTable, adapter_folder_problem
from omnistage.ar.model import ARModel, get_ar_model_class
from omnistage.ar.model_runner import ModelRunner
from omnistage.ar.paged_attention import uses_kernel
from omnistage.ar.sampling_params import SamplingParams, admit
from omnistage.ar.scheduler import Scheduler
from omnistage.ar.sequence import Sequence
from omnistage.ar.structured_outputs import GrammarCompiler
from omnistage.config.deploy_fields import StageDeployConfig
from omnistage.config.spec import StageSpec
from omnistage.core.device import device_scope, resolve_device, resolve_dtype
from omnistage.core.errors import ErrorKind, RequestError
from omnistage.core.lora import LoraSet
from omnistage.core.parking import Parked, return_freed_memory, check_can_sleep, check_can_update, torch_modules
from omnistage.core.weights import NO_FOLDER, Dropped, checkpoint_names, load_weights, read_checkpoint, weights_folder
from omnistage.core.types import InputChunk, StageOutput, StageRequest, TextPayload, TokenLogprob

logger = logging.getLogger(__name__)

_OUTPUT_FLAGS = ("return_hidden_states", "return_input_embeds")
BLOCK_SIZE = 16  # tokens per KV block, as vLLM's default


def device_memory_bytes(device) -> int:
    """Total memory of `device` (a CUDA device's, else the host's RAM): what a fractional
    `kv_cache_memory` is a fraction of."""
    import torch

    if torch.device(device).type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    import os

    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_cuda_graphs(model_class: type, device, stage: StageSpec | None) -> None:
    """`compile: true` captures the decode step in CUDA graphs (cuda_graphs.py); refuse it, naming
    the stage, where that cannot happen.

    NOTE: refused rather than run eagerly with a warning, as every deploy field nothing
    implements is (engine/factory.py): a logged warning is easy to miss, and the user would
    believe the stage runs graphs. On CPU there are no graphs, and `torch.compile` of the
    decode forward is not offered: it would compile per shape for minutes on a small CPU
    for a step whose cost is the kernels, not their launches."""
    import torch

    label = f"stage {stage.label}" if stage is not None else "AR stage"
    if torch.device(device).type != "cuda":
        raise ValueError(f"{label}: compile: true captures the AR decode step in CUDA graphs, which needs a "
                         f"CUDA device; this stage runs on {device}. Remove compile from its deploy config "
                         "(the native AR engine has no torch.compile path on CPU)")
    if not model_class.supports_cuda_graphs:
        raise ValueError(f"{label}: compile: true: {model_class.__name__} cannot be captured in CUDA graphs "
                         "(ARModel.supports_cuda_graphs is False); remove compile from this stage's deploy config")


def quantize(model: ARModel, config: StageDeployConfig, device: Any, stage: StageSpec | None) -> None:
    """`quantization` of the model's Linear layers through torchao (core/quantization.py's
    methods and `ignored_layers`), in place of the oneDNN prepacked ones. Only for a model whose
    forward just calls its linear layers (`supports_prepacked_linears`): one that reads a weight
    itself would read torchao's quantized tensor."""
    from omnistage.core.quantization import check_method, quantize_linears

    label = f"stage {stage.label}" if stage else "AR stage"
    if not model.supports_prepacked_linears:
        raise ValueError(f"{label}: quantization={config.quantization!r}: {type(model).__name__} reads its linear "
                         "weights itself (ARModel.supports_prepacked_linears is False); remove quantization")
    try:
        entry = check_method(config.quantization, device)
    except ValueError as exc:
        raise ValueError(f"{label}: {exc}") from None
    quantize_linears(model.model, entry, config.ignored_layers)


class AREngine:
    def __init__(self, model_path: str, stage: StageSpec | None = None,
                 config: StageDeployConfig = StageDeployConfig(), *,
                 return_hidden_states: bool = False, return_input_embeds: bool = False) -> None:
        self.stage = stage
        self.config = config
        self.device = device = resolve_device(config.devices)
        self.return_hidden_states = return_hidden_states
        self.return_input_embeds = return_input_embeds
        with device_scope(device):  # loading, KV buffers and CUDA graphs on this stage's GPU
            self._load(model_path, stage, config, device)
        self._seqs: dict[str, Sequence] = {}
        self._aborted: list[Sequence] = []
        self._closed = False
        self._grammars: GrammarCompiler | None = None  # built on the first structured-output request
        self._parked: Parked | None = None  # the weights, while asleep
        self._dropped: Dropped | None = None  # the weights freed by sleep level 2
        self._weights_path: str | None = weights_folder(model_path)
        """The checkpoint folder the weights are now (sleep level 2 reads them back from it); None for
        a hub id, or after an update from tensors."""

    def _load(self, model_path: str, stage: StageSpec | None, config: StageDeployConfig, device) -> None:
        """The model, its KV cache, scheduler and runner (and CUDA graphs with compile: true)."""
        model_class = get_ar_model_class(stage.model if stage else None)
        if config.compile:
            check_cuda_graphs(model_class, device, stage)
        self.model = model_class.load(model_path, stage, device, resolve_dtype(config.dtype, device))
        if config.quantization is not None:
            quantize(self.model, config, device, stage)
        elif device.type == "cpu" and config.prepack_linears is not False and self.model.supports_prepacked_linears:
            prepack_linears(self.model.model, max_batch=config.max_num_seqs, fuse=True)
        limit = self.model.max_position_embeddings
        self.max_model_len = config.max_model_len or limit
        if self.max_model_len > limit:
            raise ValueError(f"max_model_len={self.max_model_len} is larger than the model's "
                             f"max_position_embeddings={limit}")
        self.default_params = SamplingParams.from_dict(dict(config.default_sampling_params))
        self.block_size = BLOCK_SIZE
        num_blocks = self._num_blocks(config, device)
        self.block_manager = BlockManager(num_blocks, self.block_size, config.enable_prefix_caching)
        budget = config.max_num_batched_tokens
        if budget is not None and budget < config.max_num_seqs:
            raise ValueError(f"max_num_batched_tokens={budget} is less than max_num_seqs={config.max_num_seqs}: "
                             "every running sequence needs one token per step")
        self.scheduler = Scheduler(config.max_num_seqs, self.max_model_len, self.block_manager,
                                   max_num_batched_tokens=budget,
                                   enable_chunked_prefill=self.model.supports_chunked_prefill,
                                   packed=self.model.supports_packed_batch,
                                   deadline_order=self.model.audio_frame_rate is not None)
        in_place = uses_kernel(config.paged_attention, device, self.model.supports_paged_attention)
        self.runner = ModelRunner(self.model, self.block_size, num_blocks + 1, self.max_model_len, device, in_place,
                                  keep_block_states=config.enable_prefix_caching)
        if config.compile:
            self.runner.enable_static_decode(config.max_num_seqs, capture=True)
        self.loras = LoraSet(dict(config.lora_adapters), config.max_loras, self._load_adapter, self._unload_adapter,
                             adapter_folder_problem)
        if config.lora_adapters or config.max_loras:
            self._serve_adapters(config, stage)

    def _serve_adapters(self, config: StageDeployConfig, stage: StageSpec | None) -> None:
        """Rows may use LoRA adapters (lora.py): load the deploy config's `lora_adapters` now."""
        label = f"stage {stage.label}" if stage else "AR stage"
        field = "lora_adapters" if config.lora_adapters else "max_loras"
        if not self.model.supports_prepacked_linears:
            raise ValueError(f"{label}: {field}: {type(self.model).__name__} reads its linear weights itself "
                             "(ARModel.supports_prepacked_linears is False), so LoRA layers cannot wrap them")
        if config.compile:
            raise ValueError(f"{label}: {field}: not with compile: true (a CUDA graph would replay one step's "
                             "adapters for every step)")
        self.runner.adapters = AdapterTable(self.model.model, self.device, self._dtype())
        for name, path in sorted(config.lora_adapters.items()):
            problem = self._load_adapter(name, path)
            if problem is not None:
                raise ValueError(f"{label}: lora_adapters.{name}: {problem}")

    def _num_blocks(self, config: StageDeployConfig, device) -> int:
        """KV blocks in the `kv_cache_memory` budget; by default room for max_num_seqs x max_model_len."""
        per_seq = -(-self.max_model_len // self.block_size)
        if config.kv_cache_memory is None:
            return config.max_num_seqs * per_seq
        budget = config.kv_cache_memory
        if budget <= 1:
            budget *= device_memory_bytes(device)
        if self.model.kv_dims is None:
            raise ValueError("kv_cache_memory: this model does not say how large its keys are (ARModel.kv_dims)")
        kv_heads, head_dim = self.model.kv_dims
        per_block = 2 * self.model.num_layers * kv_heads * head_dim * self.block_size * self._kv_itemsize()
        num_blocks = int(budget // per_block)
        if num_blocks < per_seq:
            raise ValueError(f"kv_cache_memory={config.kv_cache_memory:g} holds {num_blocks} blocks of "
                             f"{self.block_size} tokens ({per_block} bytes each); one sequence of "
                             f"max_model_len={self.max_model_len} needs {per_seq}")
        return num_blocks

    def _kv_itemsize(self) -> int:
        return self._dtype().itemsize

    def _dtype(self):
        import torch

        return getattr(self.model.model, "dtype", None) or torch.float32  # ARModel.model: the family's torch module

    # --- Engine protocol ---------------------------------------------------------------------

    def add_request(self, request: StageRequest) -> None:
        """Validate and queue a request. Raises ValueError (naming the limit) when it cannot run."""
        with device_scope(self.device):  # a prompt may run encoders on the device
            self._add(request)

    def _add(self, request: StageRequest) -> None:
        rid = request.request_id
        if isinstance(request.inputs, InputChunk):
            self._extend(rid, request.inputs.inputs)
            return
        if rid in self._seqs:
            raise ValueError(f"request {rid!r} is already running")
        inputs = request.inputs
        flags = {"return_hidden_states": self.return_hidden_states, "return_input_embeds": self.return_input_embeds}
        if isinstance(inputs, dict) and any(k in inputs for k in _OUTPUT_FLAGS):
            inputs = dict(inputs)
            flags.update({k: bool(inputs.pop(k)) for k in _OUTPUT_FLAGS if k in inputs})
        self.model.check_prompt_size(inputs, self.max_model_len)
        prompt = self.model.build_prompt(inputs)
        params = admit(rid, request.params, self.default_params, len(prompt.token_ids), self.max_model_len)
        self.model.check_params(params)
        lora_path = None
        if params.lora is not None:  # RequestError naming lora.name / lora.path; loads nothing
            bare, lora_path = self.loras.resolve(params.lora)
            params = params.replace(lora=bare)
        tok = self.model.tokenizer
        detok = IncrementalDetokenizer(tok, prompt.token_ids, params.stop) if tok is not None else None
        if params.stop and detok is None:
            raise ValueError(f"request {rid!r}: stop strings need a tokenizer, and this model has none")
        seq = Sequence(rid, prompt.token_ids, params, max_model_len=self.max_model_len,
                       eos_token_ids=self.model.eos_token_ids, arrival_time=request.arrival_time,
                       detokenizer=detok, model_state=prompt.model_state, grammar=self._grammar(rid, params),
                       media_spans=prompt.media, cache_outputs=prompt.cache_outputs, **flags)
        if self.model.audio_frame_rate is not None:
            seq.frame_seconds = 1.0 / self.model.audio_frame_rate
        if not self.model.is_token_reproducible(prompt):
            seq.prefix_cacheable = seq.recomputable = False
        elif prompt.media or prompt.streamed:
            seq.recomputable = False  # its media features (streamed rows) are read by the first prefill only
        if prompt.streamed:
            seq.streamed = True
            seq.awaiting_input = not self.model.input_ready(seq)
        if lora_path is None or self.loras.take_slot(seq, params.lora.name, lora_path, self._loras_in_use()):
            self._schedule(seq)  # else it waits for a free adapter slot (step admits it)
        self._seqs[rid] = seq

    def _schedule(self, seq: Sequence) -> None:
        """Queue `seq`, its adapter (if any) loaded."""
        lora = seq.params.lora
        if lora is not None:
            seq.lora = (self.runner.adapters.ids[lora.name], lora.scale)
        self.scheduler.add(seq)

    def _extend(self, rid: str, inputs: Any) -> None:
        """The next input chunk of a streamed request; ignored once the request has ended (its
        upstream may still be sending when it stops on its own limits)."""
        seq = self._seqs.get(rid)
        if seq is None or seq.is_finished:
            return
        if not seq.streamed:
            raise ValueError(f"request {rid!r} was not started as a streamed request")
        self.model.extend_prompt(seq, inputs)
        seq.awaiting_input = not self.model.input_ready(seq)

    def _grammar(self, rid: str, params: SamplingParams) -> Any:
        if params.structured_outputs is None:
            return None
        if self.model.tokenizer is None:
            raise ValueError(f"request {rid!r}: structured_outputs need a tokenizer, and this model has none")
        if self._grammars is None:
            self._grammars = GrammarCompiler(self.model.tokenizer, self.model.eos_token_ids)
        return self._grammars.compile(params.structured_outputs)

    def abort_request(self, request_id: str) -> None:
        """Stop a request; its final output (finish_reason "abort") comes from the next step.
        Unknown ids are ignored."""
        seq = self.scheduler.abort(request_id)
        if seq is not None:
            self._aborted.append(seq)
        for waiting in self.loras.drop_waiting(request_id):  # still waiting for an adapter slot
            waiting.finish("abort")
            self._aborted.append(waiting)

    def step(self) -> list[StageOutput]:
        outputs = [self._finish_output(seq) for seq in self._aborted]
        self._aborted.clear()
        outputs += self._admit_lora_waiting()
        batch = self.scheduler.schedule()
        if batch is None:
            return outputs
        now = time.monotonic()
        for item in batch.prefills:
            if item.seq.first_scheduled_time is None:
                item.seq.first_scheduled_time = now
        try:
            with device_scope(self.device):
                result = self.runner.execute(batch, self.block_manager.max_block_id + 1)
        except Exception as exc:  # a failed forward ends its batch, not the engine
            logger.exception("AR forward failed for %d request(s)", batch.num_seqs)
            seqs = batch.seqs
            for seq in seqs:
                seq.finish("abort")
            self.scheduler.free_finished()
            return outputs + [self._finish_output(seq, error=f"{type(exc).__name__}: {exc}") for seq in seqs]
        self.scheduler.update(batch, result.token_ids)
        if result.logprobs:
            self._keep_logprobs([s for s in batch.seqs if s.request_id in result.logprobs], result.logprobs)
        for seq in batch.seqs:
            if seq.streamed and not seq.is_finished:
                seq.awaiting_input = not self.model.input_ready(seq)
            if seq.request_id in result.token_ids:
                outputs.append(self._output(seq, result.extras.get(seq.request_id)))
                if seq.is_finished:
                    self._release(seq)
        return outputs

    def has_unfinished_requests(self) -> bool:
        """Work a step would do now; requests that only wait for streamed input do not count
        (a stage process sleeps until their next chunk arrives)."""
        return self.scheduler.has_runnable() or bool(self._aborted) or bool(self.loras.waiting)

    def is_healthy(self) -> bool:
        return not self._closed

    # --- LoRA adapters (deploy lora_adapters, max_loras; core/lora.py, lora.py) -----------------

    def list_lora_adapters(self) -> list[dict]:
        return self.loras.describe()

    def load_lora_adapter(self, name: str, path: str) -> None:
        """Load adapter `name` from peft folder `path` now (POST /v1/lora_adapters; LoraSet.load_now)."""
        self.loras.load_now(name, path, self._loras_in_use())

    def unload_lora_adapter(self, name: str) -> None:
        """Unload adapter `name` and forget it (DELETE /v1/lora_adapters/{name})."""
        self.loras.forget(name, self._loras_in_use())

    def _loras_in_use(self) -> set[str]:
        return {seq.params.lora.name for seq in self._seqs.values() if seq.params.lora is not None}

    def _load_adapter(self, name: str, path: str) -> str | None:
        if self.runner.adapters is None:  # unreachable: LoraSet loads nothing without max_loras
            return "this stage serves no LoRA adapters (deploy lora_adapters, max_loras)"
        return self.runner.adapters.load(name, path)

    def _unload_adapter(self, name: str) -> None:
        self.runner.adapters.unload(name)

    def _admit_lora_waiting(self) -> list[StageOutput]:
        """Queue the requests whose adapter now has a slot; the refusals of those whose adapter did not load."""
        refused = self.loras.admit_waiting(self._loras_in_use, self._schedule)
        for seq, _ in refused:
            seq.finish("abort")
        return [self._finish_output(seq, refusal=e) for seq, e in refused]

    # --- sleep -----------------------------------------------------------------------------------

    def sleep(self, level: int) -> int:
        """When idle: free the KV pools (and the prefix cache that indexes them); level 1 moves the
        weights off the accelerator, level 2 frees those its checkpoint holds (wake_up reads them
        back) and moves the rest. Returns the bytes freed on the device (the KV pools on CPU)."""
        check_can_sleep(level, len(self._seqs))
        if self.runner.static_decode is not None:
            raise RuntimeError("sleep: not with compile: true (its CUDA graphs hold the KV pools and the weights' "
                               "addresses)")
        if level == 2 and self.runner.adapters is not None:
            raise RuntimeError("sleep level 2: not with lora_adapters / max_loras (LoRA layers wrap the checkpoint's "
                               "linear layers); use level 1")
        if level == 2 and self.config.quantization is not None:
            raise RuntimeError(f"sleep level 2: not with quantization={self.config.quantization!r} (waking reloads "
                               "the checkpoint's weights, which the quantized layers do not hold); use level 1")
        if level == 2 and self._weights_path is None:
            raise RuntimeError(NO_FOLDER)
        if self._parked is not None:
            return 0  # asleep already
        freed = self.runner.free_cache()
        self.block_manager.reset_prefix_cache()
        if level == 2:
            self._dropped = Dropped(self.model.model, checkpoint_names(self._weights_path))
            freed += self._dropped.num_bytes
        self._parked = Parked(torch_modules(self.model))
        return_freed_memory()
        return freed + self._parked.num_bytes

    def wake_up(self) -> None:
        if self._parked is not None:
            self._parked.restore()
            self._parked = None
        if self._dropped is not None:
            with device_scope(self.device):
                self._dropped.restore(self.model.model, read_checkpoint(self._weights_path))
            self._dropped = None

    def update_weights(self, path: str | None = None, tensors: dict[str, Any] | None = None) -> int:
        """New weights in place, when idle (the caller holds new requests back, so none sees a mix):
        the safetensors of checkpoint folder `path`, or `tensors` by state-dict name. The prefix cache
        is dropped (its KV came from the old weights). Returns how many tensors were replaced."""
        check_can_update(len(self._seqs), self._dropped is not None)
        if self.runner.adapters is not None:
            raise RuntimeError("update_weights: not with lora_adapters / max_loras (LoRA layers wrap the checkpoint's "
                               "linear layers, so their names are not the checkpoint's)")
        if self.config.quantization is not None:
            raise RuntimeError(f"update_weights: not with quantization={self.config.quantization!r} (the loaded "
                               "weights are not the checkpoint's tensors)")
        new = read_checkpoint(path) if path is not None else tensors
        with device_scope(self.device):
            num = load_weights(self.model.model, new)
        self.block_manager.reset_prefix_cache()
        self._weights_path = path
        return num

    def close(self) -> None:
        self._closed = True
        self.runner.close()
        self.model.close()

    # --- outputs -------------------------------------------------------------------------------

    def _keep_logprobs(self, seqs: list[Sequence], rows: dict[str, Any]) -> None:
        """Each sequence that got a token this step keeps its row's logprobs, with token texts."""
        backend = getattr(self.model.tokenizer, "backend_tokenizer", None)

        def text(token_id: int) -> str:
            return backend.decode([token_id], skip_special_tokens=False) if backend is not None else ""

        for seq in seqs:
            row = rows.get(seq.request_id)
            if row is None or seq.logprobs is None or len(seq.logprobs) >= seq.num_output_tokens:
                continue
            logprob, top_ids, top_lps = row
            token_id = seq.output_token_ids[-1]
            seq.logprobs.append(TokenLogprob(token_id, text(token_id), logprob,
                                             [(t, text(t), lp) for t, lp in zip(top_ids, top_lps)]))

    def _output(self, seq: Sequence, model_extras: dict[str, Any] | None) -> StageOutput:
        detok = seq.detokenizer
        delta_text = detok.take_delta() if detok is not None else ""
        extras: dict[str, Any] = dict(model_extras) if model_extras else {}
        hidden = None
        rows = self.runner.hidden.get(seq.request_id)
        if rows is not None:
            extras["delta_hidden_states"] = rows.take_delta()
            if seq.is_finished:
                hidden = rows.view()
        rows = self.runner.embeds.get(seq.request_id)
        if rows is not None:
            extras["delta_input_embeds"] = rows.take_delta()
            if seq.is_finished:
                extras["input_embeds"] = rows.view()
        payload = TextPayload(
            token_ids=list(seq.output_token_ids),
            text=detok.text if detok is not None else "",
            delta_token_ids=seq.output_token_ids[-seq.num_new_tokens:] if seq.num_new_tokens else [],
            delta_text=delta_text,
            hidden_states=hidden,
            finish_reason=seq.finish_reason,
            extras=extras,
            logprobs=list(seq.logprobs) if seq.logprobs is not None and seq.is_finished else None,
            delta_logprobs=seq.logprobs[len(seq.logprobs) - seq.num_new_tokens:] if seq.logprobs is not None else None,
        )
        return StageOutput(seq.request_id, payload, finished=seq.is_finished, metrics=self._metrics(seq))

    def _finish_output(self, seq: Sequence, error: str | None = None,
                       refusal: RequestError | None = None) -> StageOutput:
        """The last output of a request that ended outside a normal step (abort, failed forward, or
        `refusal`: its inputs refused after it was queued, an adapter that did not load)."""
        detok = seq.detokenizer
        delta_text = detok.take_delta() if detok is not None else ""
        payload = TextPayload(token_ids=list(seq.output_token_ids), text=detok.text if detok is not None else "",
                              delta_text=delta_text, finish_reason=seq.finish_reason,
                              logprobs=list(seq.logprobs) if seq.logprobs is not None else None)
        self._release(seq)
        if refusal is not None:
            return StageOutput(seq.request_id, payload, finished=True, error=refusal.message, metrics=self._metrics(seq),
                               error_kind=ErrorKind.INVALID_REQUEST, error_param=refusal.param)
        return StageOutput(seq.request_id, payload, finished=True, error=error, metrics=self._metrics(seq))

    def _release(self, seq: Sequence) -> None:
        self.runner.release(seq)
        self._seqs.pop(seq.request_id, None)

    @staticmethod
    def _metrics(seq: Sequence) -> dict[str, float]:
        m = {"num_prompt_tokens": seq.num_prompt_tokens, "num_generated_tokens": seq.num_output_tokens,
             "num_cached_tokens": seq.num_cached_tokens, "num_preemptions": seq.num_preemptions}
        if seq.first_scheduled_time is not None:
            m["queue_time"] = seq.first_scheduled_time - seq.arrival_time
        if seq.first_token_time is not None:
            m["time_to_first_token"] = seq.first_token_time - seq.arrival_time
        return m
