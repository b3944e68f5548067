"""`AREngine`: continuous batching for autoregressive stages (the `Engine` protocol).

    add_request -> Scheduler.waiting
    step():  Scheduler.schedule()      which sequences run (prefill newcomers, else decode all)
             ModelRunner.execute()     one batched forward + sampling
             Scheduler.update()        append tokens, stop rules, free slots
             -> one StageOutput(TextPayload) per sequence in the batch

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
Tensors stay on the model's device. Engine-wide defaults come from the constructor.

The engine is driven by one caller: `add_request`, `abort_request` and `step` are not
meant to be called concurrently.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from omnistage.ar.detokenizer import IncrementalDetokenizer
from omnistage.engine.device import resolve_device, resolve_dtype
from omnistage.ar.model import get_ar_model_class
from omnistage.ar.model_runner import ModelRunner, RunnerOutput
from omnistage.ar.sampling_params import SamplingParams, admit
from omnistage.ar.scheduler import Scheduler
from omnistage.ar.sequence import Sequence
from omnistage.ar.structured_outputs import GrammarCompiler
from omnistage.config.deploy_fields import StageDeployConfig
from omnistage.config.spec import StageSpec
from omnistage.engine.types import StageOutput, StageRequest, TextPayload, TokenLogprob

logger = logging.getLogger(__name__)

_OUTPUT_FLAGS = ("return_hidden_states", "return_input_embeds")


class AREngine:
    def __init__(self, model_path: str, stage: StageSpec | None = None,
                 config: StageDeployConfig = StageDeployConfig(), *,
                 return_hidden_states: bool = False, return_input_embeds: bool = False) -> None:
        self.stage = stage
        self.config = config
        device = resolve_device(config)
        self.model = get_ar_model_class(stage.model if stage else None).load(
            model_path, stage, device, resolve_dtype(config, device))
        limit = self.model.max_position_embeddings
        self.max_model_len = config.max_model_len or limit
        if self.max_model_len > limit:
            raise ValueError(f"max_model_len={self.max_model_len} is larger than the model's "
                             f"max_position_embeddings={limit}")
        self.default_params = SamplingParams.from_dict(dict(config.default_sampling_params))
        self.return_hidden_states = return_hidden_states
        self.return_input_embeds = return_input_embeds
        self.scheduler = Scheduler(config.max_num_seqs, self.max_model_len)
        self.runner = ModelRunner(self.model, config.max_num_seqs, self.max_model_len, device)
        self._seqs: dict[str, Sequence] = {}
        self._aborted: list[Sequence] = []
        self._closed = False
        self._grammars: GrammarCompiler | None = None  # built on the first structured-output request

    # --- Engine protocol ---------------------------------------------------------------------

    def add_request(self, request: StageRequest) -> None:
        """Validate and queue a request. Raises ValueError (naming the limit) when it cannot run."""
        rid = request.request_id
        if rid in self._seqs:
            raise ValueError(f"request {rid!r} is already running")
        inputs = request.inputs
        flags = {"return_hidden_states": self.return_hidden_states, "return_input_embeds": self.return_input_embeds}
        if isinstance(inputs, dict) and any(k in inputs for k in _OUTPUT_FLAGS):
            inputs = dict(inputs)
            flags.update({k: bool(inputs.pop(k)) for k in _OUTPUT_FLAGS if k in inputs})
        prompt = self.model.build_prompt(inputs)
        params = admit(rid, request.params, self.default_params, len(prompt.token_ids), self.max_model_len)
        tok = self.model.tokenizer
        detok = IncrementalDetokenizer(tok, prompt.token_ids, params.stop) if tok is not None else None
        if params.stop and detok is None:
            raise ValueError(f"request {rid!r}: stop strings need a tokenizer, and this model has none")
        seq = Sequence(rid, prompt.token_ids, params, max_model_len=self.max_model_len,
                       eos_token_ids=self.model.eos_token_ids, arrival_time=request.arrival_time,
                       detokenizer=detok, model_state=prompt.model_state, grammar=self._grammar(rid, params),
                       **flags)
        self.scheduler.add(seq)
        self._seqs[rid] = seq

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

    def step(self) -> list[StageOutput]:
        outputs = [self._finish_output(seq) for seq in self._aborted]
        self._aborted.clear()
        batch = self.scheduler.schedule()
        if batch is None:
            return outputs
        if batch.is_prefill:
            now = time.monotonic()
            for seq in batch.seqs:
                seq.first_scheduled_time = now
        try:
            result = self.runner.execute(batch)
        except Exception as exc:  # a failed forward ends its batch, not the engine
            logger.exception("AR forward failed for %d request(s)", batch.num_seqs)
            for seq in batch.seqs:
                seq.finish("abort")
            self.scheduler.free_finished()
            return outputs + [self._finish_output(seq, error=f"{type(exc).__name__}: {exc}") for seq in batch.seqs]
        self.scheduler.update(batch, result.token_ids)
        if result.logprobs is not None:
            self._keep_logprobs(batch.seqs, result.logprobs)
        for i, seq in enumerate(batch.seqs):
            outputs.append(self._output(seq, result, i))
            if seq.is_finished:
                self._release(seq)
        return outputs

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished() or bool(self._aborted)

    def is_healthy(self) -> bool:
        return not self._closed

    def close(self) -> None:
        self._closed = True
        self.runner.close()
        self.model.close()

    # --- outputs -------------------------------------------------------------------------------

    def _keep_logprobs(self, seqs: list[Sequence], rows: list[Any]) -> None:
        """Each sequence that got a token this step keeps its row's logprobs, with token texts."""
        backend = getattr(self.model.tokenizer, "backend_tokenizer", None)

        def text(token_id: int) -> str:
            return backend.decode([token_id], skip_special_tokens=False) if backend is not None else ""

        for seq, row in zip(seqs, rows):
            if row is None or seq.logprobs is None or len(seq.logprobs) >= seq.num_output_tokens:
                continue
            logprob, top_ids, top_lps = row
            token_id = seq.output_token_ids[-1]
            seq.logprobs.append(TokenLogprob(token_id, text(token_id), logprob,
                                             [(t, text(t), lp) for t, lp in zip(top_ids, top_lps)]))

    def _output(self, seq: Sequence, result: RunnerOutput, row: int) -> StageOutput:
        detok = seq.detokenizer
        delta_text = detok.take_delta() if detok is not None else ""
        extras: dict[str, Any] = dict(result.extras[row]) if result.extras else {}
        hidden = None
        rows = self.runner.hidden.get(seq.request_id)
        if rows is not None:
            extras["delta_hidden_states"] = rows.view(rows.n - rows.last)
            if seq.is_finished:
                hidden = rows.view()
        rows = self.runner.embeds.get(seq.request_id)
        if rows is not None:
            extras["delta_input_embeds"] = rows.view(rows.n - rows.last)
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

    def _finish_output(self, seq: Sequence, error: str | None = None) -> StageOutput:
        """The last output of a request that ended outside a normal step (abort, failed forward)."""
        detok = seq.detokenizer
        delta_text = detok.take_delta() if detok is not None else ""
        payload = TextPayload(token_ids=list(seq.output_token_ids), text=detok.text if detok is not None else "",
                              delta_text=delta_text, finish_reason=seq.finish_reason,
                              logprobs=list(seq.logprobs) if seq.logprobs is not None else None)
        self._release(seq)
        return StageOutput(seq.request_id, payload, finished=True, error=error, metrics=self._metrics(seq))

    def _release(self, seq: Sequence) -> None:
        self.runner.release(seq)
        self._seqs.pop(seq.request_id, None)

    @staticmethod
    def _metrics(seq: Sequence) -> dict[str, float]:
        m = {"num_prompt_tokens": seq.num_prompt_tokens, "num_generated_tokens": seq.num_output_tokens}
        if seq.first_scheduled_time is not None:
            m["queue_time"] = seq.first_scheduled_time - seq.arrival_time
        if seq.first_token_time is not None:
            m["time_to_first_token"] = seq.first_token_time - seq.arrival_time
        return m
