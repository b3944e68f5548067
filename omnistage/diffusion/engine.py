"""`DiffusionEngine`: one diffusion stage behind the `Engine` protocol.

    add_request -> validate against the checkpoint's config files (RequestError naming the
                   field), queue
    step        -> scheduler.schedule() -> executor.execute(batch) -> scheduler.update(batch, output)
    outputs     -> ProgressPayload per step per request (finished=False), a chunked pipeline's
                   VideoPayload(is_chunk=True) pieces as they are made, then the final
                   ImagePayload / VideoPayload (finished=True) with metrics, or an error

Every `step()` is one denoising step of the running batch, in both modes: request mode
(`RequestScheduler`) forms a batch once and runs it to the end, step mode (`StepScheduler`,
`step_execution: true`) lets requests join and leave between steps. So progress leaves as
each step finishes, an abort stops a request's compute before the next step, and an
inline stage never holds its caller for a whole generation. A failing batch fails its own
requests; a dead worker raises `WorkerDiedError` out of `step()` (the stage's supervisor
fails what the stage held and rebuilds it), and the engine then reports unhealthy and
refuses new work.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from typing import Any

from omnistage.config.deploy_fields import StageDeployConfig
from omnistage.config.spec import StageSpec
from omnistage.core.errors import ErrorKind
from omnistage.core.parking import check_can_sleep, check_can_update
from omnistage.core.types import InputChunk, StageOutput, StageRequest
from omnistage.diffusion.accel import check_family, check_supported
from omnistage.diffusion.checkpoint import CheckpointConfigs
from omnistage.diffusion.executor import Executor, WorkerDiedError, get_executor_class
from omnistage.diffusion.inputs import check_default_params, freeze, seeded, to_diffusion_request
from omnistage.core.lora import LoraSet
from omnistage.diffusion.accel.lora import lora_file_problem
from omnistage.diffusion.progress import ProgressBar
from omnistage.diffusion.registry import pipeline_class
from omnistage.diffusion.runner import error_message
from omnistage.diffusion.sched import EngineRequest, RequestScheduler, RequestStatus, RunnerOutput, StepScheduler
from omnistage.core.device import resolve_devices
from omnistage.diffusion.worker import WorkerConfig

# Longest nap in step() while a not-full batch waits for a burst, so new requests and
# aborts are still picked up promptly.
MAX_IDLE_SLEEP_S = 0.005


class DiffusionEngine:
    def __init__(self, model_path: str, stage: StageSpec | None = None,
                 config: StageDeployConfig = StageDeployConfig(), *, pipeline_cls: type | None = None,
                 show_progress: bool = False, clock: Callable[[], float] = time.monotonic):
        """`pipeline_cls` overrides the class picked from the checkpoint (custom pipelines,
        tests). `show_progress` shows a tqdm bar (the offline API turns it on)."""
        label = stage.label if stage is not None else "diffusion"
        check_supported(label, config)
        self.model_path = str(model_path)
        self.config = config
        self.pipeline_cls, configs = _class_and_configs(stage, self.model_path, pipeline_cls)
        check_family(label, config, self.pipeline_cls)
        # Requests are checked here, against the checkpoint's config files: no round trip to a worker.
        self.checker = self.pipeline_cls.for_requests(configs, config)
        check_default_params(config.default_sampling_params)
        devices = tuple(str(device) for device in resolve_devices(config.devices, config.num_devices))
        self.scheduler = self._make_scheduler(config, clock)
        self.clock = clock
        self.progress = ProgressBar(show_progress)
        self._lock = threading.Lock()  # guards the scheduler: add/abort may come from another thread
        self._dead: str | None = None
        self._closed = False
        self._updates: dict[str, list[dict]] = {}  # request_id -> prompt updates for the next batch
        self.executor: Executor = get_executor_class(config.executor)(
            WorkerConfig(self.model_path, self.pipeline_cls, devices, config))
        self.loras = LoraSet(dict(config.lora_adapters), config.max_loras, self._load_lora, self._unload_lora,
                             lora_file_problem)

    def _make_scheduler(self, config: StageDeployConfig, clock: Callable[[], float]):
        cap = getattr(self.pipeline_cls, "max_batch_size", None)
        max_num_seqs = min(config.max_num_seqs, cap) if cap else config.max_num_seqs
        scheduler_cls = StepScheduler if config.step_execution else RequestScheduler
        return scheduler_cls(max_num_seqs, config.request_batch_max_wait_ms, clock)

    @classmethod
    def request_checker(cls, model_path: str, stage: StageSpec | None,
                        config: StageDeployConfig) -> Callable[[StageRequest], None]:
        """What `add_request` checks, without the weights (the checkpoint's config files only),
        so the server can refuse a request before it answers for it (a video job): raises
        RequestError naming the field."""
        pipeline_cls, configs = _class_and_configs(stage, str(model_path))
        checker = pipeline_cls.for_requests(configs, config)

        def check(request: StageRequest) -> None:
            _prepare(checker, request)  # an adapter by path is checked on arrival (the engine's LoraSet)

        return check

    # -- the Engine protocol -------------------------------------------------------------

    def add_request(self, request: StageRequest) -> None:
        if isinstance(request.inputs, InputChunk):  # a prompt update for a running request
            return self._add_update(request.request_id, request.inputs.inputs)
        if not self.is_healthy():
            raise RuntimeError(f"diffusion engine is unhealthy and takes no new requests: {self._dead}")
        diffusion_request, key, lora_path = _prepare(self.checker, request, self.loras)
        engine_request = EngineRequest(diffusion_request, freeze(key), arrival_time=self.clock(),
                                       submitted_time=request.arrival_time,
                                       num_steps=diffusion_request.params.num_inference_steps)
        with self._lock:  # the scheduler refuses a request_id already running
            if lora_path is None or self.loras.take_slot(engine_request, diffusion_request.params.lora.name,
                                                         lora_path, self._loras_in_use()):
                self.scheduler.add_request(engine_request)

    def _add_update(self, request_id: str, update: dict) -> None:
        """Held for the request's next batch; ignored once it has ended (or where the family
        takes none: the server asks `takes_prompt_updates` before it sends one)."""
        if not self.pipeline_cls.takes_prompt_updates:
            return
        with self._lock:
            if self.scheduler.get_request(request_id) is not None:
                self._updates.setdefault(request_id, []).append(dict(update))

    def abort_request(self, request_id: str) -> None:
        with self._lock:
            self.scheduler.abort_request(request_id)
            self.loras.drop_waiting(request_id)
            self._updates.pop(request_id, None)

    def step(self) -> list[StageOutput]:
        if not self.is_healthy():
            raise WorkerDiedError(self._dead)
        with self._lock:
            refused = self._admit_lora_waiting()
            batch = self.scheduler.schedule()
            batch.updates = {rid: self._updates.pop(rid) for rid in batch.req_ids if rid in self._updates}
        if batch.is_empty:
            if not refused:
                self._idle()
            return refused
        on_progress = self.progress.update if self.progress.enabled else None
        try:
            output = self.executor.execute(batch, on_progress=on_progress)
        except WorkerDiedError as exc:
            self._dead = str(exc)
            self.progress.close()
            raise
        except Exception as exc:  # noqa: BLE001 - e.g. a batch that could not be sent: fail it, keep serving
            output = RunnerOutput.failed(batch, error_message(exc))
        with self._lock:
            finished = self.scheduler.update(batch, output)
            for req in finished:
                self._updates.pop(req.request_id, None)
            outputs = refused + self._outputs(output, finished)
        if not self.has_unfinished_requests():
            self.progress.close()
        return outputs

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests() or bool(self.loras.waiting)

    # -- LoRA adapters loaded by path (deploy max_loras; core/lora.py) --------------------

    def list_lora_adapters(self) -> list[dict]:
        return self.loras.describe()

    def load_lora_adapter(self, name: str, path: str) -> None:
        """Load adapter `name` from `path` now (POST /v1/lora_adapters; LoraSet.load_now)."""
        with self._lock:
            self.loras.load_now(name, path, self._loras_in_use())

    def unload_lora_adapter(self, name: str) -> None:
        """Unload adapter `name` and forget it (DELETE /v1/lora_adapters/{name})."""
        with self._lock:
            self.loras.forget(name, self._loras_in_use())

    def _loras_in_use(self) -> set[str]:
        return {r.request.params.lora.name for r in self.scheduler.requests.values() if r.request.params.lora}

    def _load_lora(self, name: str, path: str) -> str | None:
        problems = [p for p in self.executor.collective_rpc("load_lora", name, path) if p is not None]
        if problems:  # one rank failed: the others drop it too, so every rank holds the same set
            self.executor.collective_rpc("unload_lora", name)
        return problems[0] if problems else None

    def _unload_lora(self, name: str) -> None:
        self.executor.collective_rpc("unload_lora", name)

    def _admit_lora_waiting(self) -> list[StageOutput]:
        """Queue the waiting requests whose adapter now has a slot; the refusals of those whose file
        did not load."""
        refused = self.loras.admit_waiting(self._loras_in_use, self.scheduler.add_request)
        return [StageOutput(r.request_id, None, finished=True, error=e.message, error_kind=ErrorKind.INVALID_REQUEST,
                            error_param=e.param) for r, e in refused]

    def sleep(self, level: int) -> int:
        """When idle: every rank moves its pipeline's weights off the accelerator (level 1), or frees
        those its checkpoint holds and moves the rest (level 2; wake_up reads them back). A diffusion
        stage keeps no cache between requests. Returns the bytes freed on the devices."""
        check_can_sleep(level, int(self.has_unfinished_requests()))
        if level == 2:
            self._check_weights_in_place("sleep level 2")
        return sum(self.executor.collective_rpc("sleep", level))

    def update_weights(self, path: str | None = None, tensors: dict[str, Any] | None = None) -> int:
        """New weights on every rank, in place, when idle (the caller holds new requests back, so none
        sees a mix): the component folders of pipeline folder `path` that hold safetensors, or
        `tensors` named "{component}.{state-dict name}". Returns how many tensors were replaced."""
        check_can_update(int(self.has_unfinished_requests()), False)
        self._check_weights_in_place("update_weights")
        return self.executor.collective_rpc("update_weights", path, tensors)[0]

    def _check_weights_in_place(self, what: str) -> None:
        """Weights are copied into the loaded tensors by name: not into quantized or LoRA-fused ones,
        nor into layers that layerwise offload streams from its own host copies."""
        changed = [f"{name}={getattr(self.config, name)!r}" for name in ("quantization", "transformer_file", "lora",
                                                                         "lora_adapters", "max_loras", "offload")
                   if getattr(self.config, name)]
        if changed:
            raise RuntimeError(f"{what}: not with {', '.join(changed)} (the loaded weights are not the "
                               f"checkpoint's tensors)")

    def wake_up(self) -> None:
        self.executor.collective_rpc("wake_up")

    def is_healthy(self) -> bool:
        if self._dead is None and not self.executor.is_healthy():
            self._dead = "a diffusion worker died"
        return self._dead is None

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.progress.close()
        self.executor.close()
        self._dead = self._dead or "engine closed"

    def __enter__(self) -> "DiffusionEngine":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    # -- helpers -------------------------------------------------------------------------

    def _outputs(self, output: RunnerOutput, finished: list[EngineRequest]) -> list[StageOutput]:
        """Progress and streamed chunks of live requests first, then the finished ones (aborted
        ones say nothing)."""
        finished_ids = {r.request_id for r in finished}
        outputs = [StageOutput(rid, payload, finished=False) for rid, payload in [*output.progress, *output.chunks]
                   if rid in finished_ids or self.scheduler.get_request(rid) is not None]
        for req in finished:
            rid = req.request_id
            if req.status is RequestStatus.FINISHED:
                outputs.append(StageOutput(rid, output.payloads[rid], finished=True,
                                           metrics={**self._metrics(req), **output.metrics.get(rid, {})}))
            else:
                error = output.errors.get(rid, "the worker returned no output for this request")
                outputs.append(StageOutput(rid, None, finished=True, error=error, metrics=self._metrics(req)))
        return outputs

    @staticmethod
    def _metrics(req: EngineRequest) -> dict[str, float]:
        start = req.scheduled_time if req.scheduled_time is not None else req.finish_time
        return {
            "queue_time": start - req.arrival_time,
            "run_time": req.finish_time - start,
            "num_steps": req.num_steps_done,
            "batch_size": req.mean_batch_size,
            "seed": req.request.params.seed,
        }

    def _idle(self) -> None:
        """Nothing to run: nap while a not-full batch waits for a burst to fill it."""
        wait = self.scheduler.wait_time()
        if wait > 0:
            time.sleep(min(wait, MAX_IDLE_SLEEP_S))


def _class_and_configs(stage: StageSpec | None, model_path: str, pipeline_cls: type | None = None
                       ) -> tuple[type, CheckpointConfigs]:
    """The stage's pipeline class (`pipeline_cls`, else the stage's model key, else the
    checkpoint's `_class_name`) and the checkpoint's config files as that class reads them."""
    if pipeline_cls is None and stage is not None and stage.model:
        pipeline_cls = pipeline_class(stage.model)
    if pipeline_cls is None:
        configs = CheckpointConfigs.read(model_path)
        return pipeline_class(configs.class_name), configs
    read = getattr(pipeline_cls, "read_configs", CheckpointConfigs.read)  # a test's stand-in class may lack it
    return pipeline_cls, read(model_path)


def _prepare(checker, request: StageRequest, loras: LoraSet | None = None) -> tuple:
    """(the checked, seeded request, its batch key, the path its LoRA adapter loads from: None
    when the engine needs not load one); RequestError naming the field."""
    diffusion_request = seeded(checker.prepare_request(to_diffusion_request(request)))
    lora_path = None
    if loras is not None and diffusion_request.params.lora is not None:
        lora, lora_path = loras.resolve(diffusion_request.params.lora)
        diffusion_request = dataclasses.replace(diffusion_request,
                                                params=diffusion_request.params.model_copy(update={"lora": lora}))
    return diffusion_request, checker.batch_key(diffusion_request.params), lora_path

