"""The Python API: `AsyncOmni` (streaming, the server's core) and `Omni` (offline batches).

Both stand on one `Orchestrator`, whose loop runs in a background thread and steps every
stage; nothing here loops over stages. `AsyncOmni.generate` submits a request and reads
its outputs from an asyncio queue the loop feeds; `Omni.generate` submits a batch and
reads the finished outputs from a thread-safe queue.

    with Omni("path/to/z-image") as omni:
        [out] = omni.generate("a cat", DiffusionParams(num_inference_steps=4))
        out.images[0].save("cat.png")

    omni = AsyncOmni("path/to/qwen2")
    async for out in omni.generate("Hello", SamplingParams(max_tokens=32)):
        print(out.text_delta, end="")

`model` is a checkpoint folder or hub id, or a pipeline folder naming one checkpoint per
stage (see `omnistage.engine.factory.stage_model_paths`). Stages with `runtime:
process` are spawned, so a script that uses them needs the `if __name__ == "__main__":`
guard. Deploy settings come from the
deploy file (`deploy_config`, default: the family's bundled one), then `**overrides`
(fields applied to every stage of a kind that uses them, e.g. `max_num_seqs=8`,
`cache_backend="tea_cache"`), then `stage_overrides` (`{"0": {...}, "*": {...}}`).

Params: one object (given to every stage of the kind it belongs to: DiffusionParams to
diffusion stages, SamplingParams to AR stages), a list with one entry per stage in
stage order, or a dict keyed by stage name. None = each engine's defaults.

`Omni.generate` also takes per-prompt params, as vLLM's `LLM.generate` does: a list with
one entry per prompt (each entry any of the forms above), e.g. eight seeds for eight
prompts. A list is read per prompt when the call got a list of prompts of that length
and the list is not a valid per-stage list (each entry None or the params of its
stage's kind); per stage when only that reading fits. When both fit (as many prompts
as stages, and the entries match the stages' kinds) the call is refused as ambiguous:
give per-stage params as a dict by stage name, or per-prompt entries as dicts.

`modalities` (e.g. ["text"]) asks a request for fewer outputs than the pipeline makes:
only the stages needed for them run (an omni model's thinker alone, no talker or
vocoder). None = every final stage's output.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import queue
import time
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from omnistage.config import (
    DeployConfig,
    EffectiveConfig,
    PipelineSpec,
    build_effective_config,
    detect_platform,
    load_deploy_config,
    parse_stage_overrides,
    resolve_pipeline,
)
from omnistage.config.deploy import ALL_STAGES, DeployLayer, merge_fields
from omnistage.config.deploy_fields import KIND_ONLY_FIELDS
from omnistage.core.errors import RequestError
from omnistage.core.parking import check_can_sleep
from omnistage.engine.factory import EngineFactory, create_engine
from omnistage.engine.orchestrator import OmniRequest, Orchestrator
from omnistage.engine.replicas import replicas_of
from omnistage.engine.outputs import OmniOutput


class OmniRequestError(RuntimeError):
    """A request of `Omni.generate` failed; `output.error` names the stage."""

    def __init__(self, output: OmniOutput, outputs: list[OmniOutput] | None = None):
        super().__init__(f"request {output.request_id!r} failed: {output.error}")
        self.output = output
        self.outputs = outputs
        """Every output of the batch, in input order (failed ones have `error` set)."""


class AsyncOmni:
    def __init__(
        self,
        model: str | Path,
        deploy_config: DeployConfig | str | Path | None = None,
        stage_overrides: str | Mapping[str, Any] | None = None,
        *,
        pipeline: PipelineSpec | None = None,
        engine_factory: EngineFactory = create_engine,
        metrics_registry: Any = None,
        **overrides: Any,
    ):
        """Resolve the pipeline and deploy config, and start every stage.

        `pipeline` skips detection (a spec built by hand). `engine_factory` builds each
        stage's engine (tests pass fakes). `metrics_registry` is the prometheus_client
        registry to export into (default: one of this instance's own). A stage whose engine
        or process dies or hangs is rebuilt as its deploy fields say (`max_restarts`, ...).
        """
        self.config = load_config(model, deploy_config, stage_overrides, overrides, pipeline)
        self.spec = self.config.pipeline
        self.orchestrator = Orchestrator(
            self.spec, str(model), self.config.stage_configs,
            connector=self.config.pipeline_config.connector,
            shm_threshold_bytes=self.config.pipeline_config.shm_threshold_bytes,
            engine_factory=engine_factory, metrics_registry=metrics_registry,
        )
        self.sleep_level: int | None = None
        """The level `sleep()` put the stages to, or None while awake."""
        self.orchestrator.start()

    @property
    def metrics_registry(self) -> Any:
        return self.orchestrator.metrics_registry

    def make_request(self, prompt: Any, params: Any = None, request_id: str | None = None,
                     modalities: Sequence[str] | None = None, session_id: str | None = None) -> OmniRequest:
        """Check `params` against the pipeline (ValueError naming the problem) and build the request."""
        if isinstance(modalities, str):
            raise ValueError(f"modalities: give a list of modalities such as [{modalities!r}], not a str")
        return OmniRequest(request_id or uuid.uuid4().hex, prompt, resolve_params(self.spec, params),
                           output_modalities=None if modalities is None else tuple(modalities),
                           session_id=session_id)

    async def generate(self, prompt: Any, params: Any = None, request_id: str | None = None, *,
                       modalities: Sequence[str] | None = None,
                       session_id: str | None = None) -> AsyncIterator[OmniOutput]:
        """Yield the request's outputs as they come; the last has `finished=True`.

        A failed request ends with an output whose `error` names the stage (nothing is
        raised, so a stream can report it). Bad params, or `modalities` the pipeline does
        not make, raise ValueError on the first iteration, before anything is queued.
        Leaving the loop early aborts the request.
        """
        request = self.make_request(prompt, params, request_id, modalities, session_id)
        loop = asyncio.get_running_loop()
        outputs: asyncio.Queue[OmniOutput] = asyncio.Queue()
        self.orchestrator.submit(request, sink=lambda out: loop.call_soon_threadsafe(outputs.put_nowait, out))
        finished = False
        try:
            while not finished:
                out = await outputs.get()
                finished = out.finished
                yield out
        finally:
            if not finished:
                self.orchestrator.abort(request.request_id)

    async def check(self, prompt: Any, params: Any = None, request_id: str | None = None, *,
                    modalities: Sequence[str] | None = None) -> None:
        """Raise ValueError naming the stage and field if the pipeline would refuse this request
        on arrival (its params, or inputs that crashed a stage before), queueing nothing: for
        work answered before it runs, such as a video job (`Orchestrator.check`)."""
        request = self.make_request(prompt, params, request_id, modalities)
        await asyncio.to_thread(self.orchestrator.check, request)

    async def abort(self, request_id: str) -> None:
        self.orchestrator.abort(request_id)

    async def update(self, request_id: str, inputs: dict) -> None:
        """New inputs for a running request: a prompt update of a chunked video model (Helios),
        `{"event_id", "prompt", "transition_chunks"}`, applied from its next chunk; or the next
        audio of a full-duplex model's stream (Moshi: `{"audio", "final"}`). The request must
        be running (its first output came): an update that arrives before is dropped."""
        self.orchestrator.update(request_id, inputs)

    async def check_health(self) -> bool:
        return self.orchestrator.check_health()

    # --- sleep ---------------------------------------------------------------------------------

    async def sleep(self, level: int = 1, timeout_s: float = 300.0) -> int:
        """Free the device for someone else: refuse new requests from now on (they raise
        EngineUnavailableError; the server answers 503 + Retry-After), let the running ones
        finish (at most `timeout_s`), then put every stage's engine (every replica) to sleep.
        Level 1: weights moved to host memory, caches (the AR KV pools) freed. Level 2: the
        weights' storage freed too (wake-up reads them back from the checkpoint folder, or
        from the last `update_weights` path). Returns the bytes freed. `wake_up()` undoes it; a stage rebuilt meanwhile comes back asleep."""
        check_can_sleep(level, 0)
        if self.sleep_level is not None:
            return 0
        orchestrator = self.orchestrator
        taken_in = orchestrator.pause(f"the engine is asleep (sleep level {level}) until it is woken up")
        try:
            deadline = time.monotonic() + timeout_s
            await asyncio.to_thread(taken_in.wait, timeout_s)
            while orchestrator.has_unfinished_requests():  # the running requests finish first
                if time.monotonic() > deadline:
                    raise TimeoutError(f"sleep: requests still running after {timeout_s:.0f} s")
                await asyncio.sleep(0.01)
            replies = await asyncio.gather(*map(asyncio.wrap_future, orchestrator.call_stages("sleep", level)))
        except BaseException:
            with contextlib.suppress(Exception):  # whatever fell asleep wakes; the sleep's error is the news
                await self._wake_stages()
            orchestrator.resume()
            raise
        self.sleep_level = level
        orchestrator.set_standing("sleep", level)  # a stage rebuilt while asleep comes back asleep
        return sum(sum(r) if isinstance(r, list) else r for r in replies)  # a replica set replies per copy

    async def wake_up(self) -> None:
        """Undo `sleep()`: every stage's weights back on its device, then requests are admitted again."""
        self.orchestrator.clear_standing("sleep")
        try:
            await self._wake_stages()
        finally:
            self.sleep_level = None
            self.orchestrator.resume()

    async def _wake_stages(self) -> None:
        replies = await asyncio.gather(*map(asyncio.wrap_future, self.orchestrator.call_stages("wake_up")),
                                       return_exceptions=True)
        failed = next((r for r in replies if isinstance(r, BaseException)), None)
        if failed is not None:
            raise failed

    @property
    def is_sleeping(self) -> bool:
        return self.sleep_level is not None

    # --- weight updates ------------------------------------------------------------------------

    async def update_weights(self, stage: str | int, path: str | Path | None = None, *,
                             tensors: Mapping[str, Any] | None = None, timeout_s: float = 300.0) -> int:
        """Give stage `stage` (its name or id) new weights without a restart: the safetensors of
        checkpoint folder `path` (for a diffusion stage, a pipeline folder: the component
        subfolders it holds), or `tensors` by state-dict name ("{component}.{name}" for a diffusion
        stage), on every copy of the stage.

        No request sees a mix: requests submitted from now on wait (queued, not refused), the
        running ones finish on the old weights (at most `timeout_s`), the weights are copied in
        between two steps, then the waiting requests start on the new ones. A stage rebuilt later
        (a crash, autoscaling) gets the same update before it serves. Returns the tensors
        replaced per copy. ValueError naming `stage` or `path` when they are wrong (nothing
        changes); RuntimeError when the stage cannot (asleep, quantized, ...)."""
        stage_id = self._stage_id(stage)
        if (path is None) == (tensors is None):
            raise RequestError("path", "path: give a checkpoint folder, or tensors, not both and not neither")
        if path is not None:
            path = str(Path(path).expanduser())
            if not Path(path).is_dir():
                raise RequestError("path", f"path: {path!r} is not a folder on the server")
        if self.sleep_level is not None:
            raise RuntimeError("update_weights: the engine is asleep; wake it up first")
        orchestrator = self.orchestrator
        taken_in = orchestrator.hold()
        try:
            deadline = time.monotonic() + timeout_s
            await asyncio.to_thread(taken_in.wait, timeout_s)
            while orchestrator.has_unfinished_requests():  # the running requests finish on the old weights
                if time.monotonic() > deadline:
                    raise TimeoutError(f"update_weights: requests still running after {timeout_s:.0f} s")
                await asyncio.sleep(0.01)
            tensors = None if tensors is None else dict(tensors)
            # Standing first: a copy that joins meanwhile (autoscaling, a rebuild) gets the update too.
            before = replicas_of(orchestrator.handles[stage_id])[0].standing.get("update_weights")
            orchestrator.set_standing("update_weights", path, tensors, stage_ids=(stage_id,))
            try:
                reply = await asyncio.wrap_future(orchestrator.handles[stage_id].call("update_weights", path, tensors))
            except BaseException as e:
                if before is None:
                    orchestrator.clear_standing("update_weights", stage_ids=(stage_id,))
                else:
                    orchestrator.set_standing("update_weights", *before, stage_ids=(stage_id,))
                if isinstance(e, ValueError):  # names or shapes the stage does not have: nothing was changed
                    raise RequestError("path" if path is not None else "tensors", f"stage {stage!r}: {e}") from None
                raise
        finally:
            orchestrator.release()
        return reply[0] if isinstance(reply, list) else reply  # a replica set replies per copy

    # --- LoRA adapters loaded by path -----------------------------------------------------------

    async def list_lora_adapters(self) -> list[dict]:
        """The LoRA adapters of every diffusion or AR stage that serves some (deploy `lora_adapters` or
        `max_loras`): name, path, loaded (held now, on the stage's first copy), source ("deploy"
        or "path") and stage (its name)."""
        adapters = []
        for stage in self._lora_stages(hot=False):
            reply = await asyncio.wrap_future(replicas_of(self.orchestrator.handles[stage.id])[0]
                                              .call("list_lora_adapters"))
            adapters += [{**adapter, "stage": stage.name} for adapter in reply]
        return adapters

    async def load_lora_adapter(self, name: str, path: str | Path) -> None:
        """Load LoRA adapter `name` from file `path` now, on every copy of every stage with
        `max_loras`, as a request's `lora: {name, path}` would on first use. RequestError naming
        `path` (a missing file, an adapter for another model: nothing is loaded) or `name`;
        RuntimeError when every slot holds an adapter that a queued or running request uses."""
        await self._call_lora_stages("load_lora_adapter", name, str(Path(path).expanduser()))

    async def unload_lora_adapter(self, name: str) -> None:
        """Unload adapter `name` (loaded by path) and forget it. RequestError naming `name` for an
        unknown or deploy-declared one; RuntimeError while a request uses it."""
        await self._call_lora_stages("unload_lora_adapter", name)

    async def _call_lora_stages(self, method: str, *args: Any) -> None:
        calls = [replica.call(method, *args) for stage in self._lora_stages(hot=True)
                 for replica in replicas_of(self.orchestrator.handles[stage.id])]
        await asyncio.gather(*map(asyncio.wrap_future, calls))

    def _lora_stages(self, hot: bool) -> list:
        """The diffusion and AR stages that load adapters by path (`hot`), or that serve any."""
        def serves(config) -> bool:
            return config.max_loras > 0 or (not hot and bool(config.lora_adapters))

        stages = [s for s in self.spec.stages
                  if s.kind in ("diffusion", "ar") and serves(self.config.stage_config(s.id))]
        if hot and not stages:
            raise RuntimeError("no stage of this model loads LoRA adapters by path (deploy max_loras: 0)")
        return stages

    def _stage_id(self, stage: str | int) -> int:
        for s in self.spec.stages:
            if stage in (s.id, s.name) and not isinstance(stage, bool):
                return s.id
        raise RequestError("stage", f"stage: {stage!r} is not a stage of pipeline {self.spec.name!r} "
                                    f"({self.spec.describe_stages()})")

    async def shutdown(self) -> None:
        # close() waits for the step in flight; keep the event loop serving meanwhile.
        await asyncio.to_thread(self.close)

    def close(self) -> None:
        """Stop every stage; open requests end with an error output."""
        self.orchestrator.close()

    async def __aenter__(self) -> AsyncOmni:
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.shutdown()


class Omni:
    """Offline batches over the same orchestrator as `AsyncOmni` (see the module docstring)."""

    def __init__(
        self,
        model: str | Path,
        deploy_config: DeployConfig | str | Path | None = None,
        stage_overrides: str | Mapping[str, Any] | None = None,
        *,
        pipeline: PipelineSpec | None = None,
        engine_factory: EngineFactory = create_engine,
        metrics_registry: Any = None,
        **overrides: Any,
    ):
        self.async_omni = AsyncOmni(model, deploy_config, stage_overrides, pipeline=pipeline,
                                    engine_factory=engine_factory, metrics_registry=metrics_registry, **overrides)

    @property
    def spec(self) -> PipelineSpec:
        return self.async_omni.spec

    def generate(self, prompts: Any, params: Any = None, *, modalities: Sequence[str] | None = None,
                 use_tqdm: bool = True) -> list[OmniOutput]:
        """The finished output of each prompt, in input order.

        `prompts` is one prompt (a str, or a dict such as {"prompt": ..., "image": PIL},
        or {"messages": [...]}) or a list of them; a bare list of chat messages must be
        wrapped in a list. `params` is for every prompt, or a list with one entry per
        prompt (see the module docstring for how it is told from a per-stage list). Raises OmniRequestError (naming the stage) after the whole
        batch has ended if any request failed; the error holds every output. `modalities`
        the pipeline does not make raise ValueError before anything is queued.
        """
        from tqdm.auto import tqdm

        prompt_list = _prompt_list(prompts)
        per_prompt = params_per_prompt(self.spec, params, len(prompt_list) if _is_prompt_list(prompts) else None)
        requests = [self.async_omni.make_request(p, q, modalities=modalities) for p, q in zip(prompt_list, per_prompt)]
        done: queue.Queue[OmniOutput] = queue.Queue()
        for request in requests:
            self.async_omni.orchestrator.submit(request, sink=done.put)
        results: dict[str, OmniOutput] = {}
        steps: dict[str, tuple[int, int]] = {}  # denoising progress per request: (step, num_steps)
        try:
            with tqdm(total=len(requests), desc="Generating", unit="req", disable=not use_tqdm) as bar:
                while len(results) < len(requests):
                    out = done.get()
                    if out.progress is not None and use_tqdm:
                        steps[out.request_id] = (out.progress.step, out.progress.num_steps)
                        bar.set_postfix_str(f"denoising steps {sum(s for s, _ in steps.values())}/"
                                            f"{sum(n for _, n in steps.values())}")
                    if out.finished:
                        results[out.request_id] = out
                        bar.update(1)
        except BaseException:  # e.g. KeyboardInterrupt: leave nothing running
            for request in requests:
                if request.request_id not in results:
                    self.async_omni.orchestrator.abort(request.request_id)
            raise
        outputs = [results[r.request_id] for r in requests]
        failed = [out for out in outputs if out.error is not None]
        if failed:
            raise OmniRequestError(failed[0], outputs)
        return outputs

    def close(self) -> None:
        self.async_omni.close()

    def __enter__(self) -> Omni:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


# --- config and params ----------------------------------------------------------------------


def load_config(
    model: str | Path,
    deploy_config: DeployConfig | str | Path | None,
    stage_overrides: str | Mapping[str, Any] | None,
    overrides: Mapping[str, Any],
    pipeline: PipelineSpec | None = None,
) -> EffectiveConfig:
    """The pipeline (detected, or `pipeline`) with every deploy layer merged."""
    platform = detect_platform()
    found: dict[str, Any] = {"model": str(model)}
    if pipeline is None:
        resolution = resolve_pipeline(model, deploy_config, platform=platform)
        pipeline, deploy = resolution.spec, resolution.deploy
        found.update(pipeline_key=resolution.key, resolved_by=resolution.rule)
    else:
        deploy = load_deploy_config(deploy_config) if isinstance(deploy_config, (str, Path)) else deploy_config
        found.update(resolved_by="given pipeline")
    layer = override_layer(pipeline, stage_overrides, overrides)
    config = build_effective_config(pipeline, deploy, platform=platform, stage_overrides=layer)
    return dataclasses.replace(config, **found)


def override_layer(spec: PipelineSpec, stage_overrides: str | Mapping[str, Any] | None,
                   overrides: Mapping[str, Any]) -> DeployLayer:
    """`stage_overrides` over `overrides`, as one layer of per-stage fields.

    An override goes to every stage whose kind uses it (KIND_ONLY_FIELDS); one no stage
    uses is an error, not a silent no-op. Within `stage_overrides`, a numbered entry
    beats "*", and both beat `overrides`.
    """
    user = parse_stage_overrides(stage_overrides)
    given = parse_stage_overrides({ALL_STAGES: dict(overrides)}).stage_fields.get(ALL_STAGES, {})
    unused = [name for name in given if not any(_uses(stage.kind, name) for stage in spec.stages)]
    if unused:
        kinds = ", ".join(f"{name} ({_kind_of(name)} stages)" for name in unused)
        raise ValueError(f"pipeline {spec.name!r} has no stage that uses {kinds}; stages: {spec.describe_stages()}")
    stage_fields = {key: values for key, values in user.stage_fields.items() if key != ALL_STAGES}
    for stage in spec.stages:
        mine = {name: value for name, value in given.items() if _uses(stage.kind, name)}
        stage_fields[stage.id] = merge_fields(mine, user.fields_for(stage.id))
    return DeployLayer(origin="Omni(**overrides) and stage_overrides", stage_fields=stage_fields)


def _kind_of(field_name: str) -> str | None:
    return next((kind for kind, names in KIND_ONLY_FIELDS.items() if field_name in names), None)


def _uses(kind: str, field_name: str) -> bool:
    owner = _kind_of(field_name)
    return owner is None or owner == kind


def params_per_prompt(spec: PipelineSpec, params: Any, num_prompts: int | None) -> list[Any]:
    """One params per prompt. `num_prompts` is None when the call got a single prompt."""
    count = 1 if num_prompts is None else num_prompts
    if num_prompts is None or not isinstance(params, (list, tuple)) or len(params) != num_prompts:
        return [params] * count
    stages = spec.stages
    per_stage = len(params) == len(stages) and all(
        p is None or _params_kind(p) == stage.kind for stage, p in zip(stages, params))
    if not per_stage:
        return list(params)
    if len(stages) == 1:  # one prompt, one stage: both readings are the same
        return [params] * count
    raise ValueError(f"params: a list of {len(params)} for {num_prompts} prompts fits pipeline {spec.name!r} "
                     f"({spec.describe_stages()}) per stage and per prompt; give per-stage params as a dict by "
                     f"stage name, or per-prompt params as a list of dicts by stage name")


def resolve_params(spec: PipelineSpec, params: Any) -> dict[int, Any]:
    """Params per stage id from one object, a per-stage list, or a dict by stage name."""
    stages = spec.stages
    if params is None:
        return {}
    if isinstance(params, (list, tuple)):
        if len(params) != len(stages):
            raise ValueError(f"params: got a list of {len(params)}, but pipeline {spec.name!r} has "
                             f"{len(stages)} stages ({spec.describe_stages()}); give one entry per stage")
        by_stage = {stage.id: p for stage, p in zip(stages, params) if p is not None}
    elif isinstance(params, Mapping):
        names = {stage.name: stage.id for stage in stages}
        unknown = sorted(str(k) for k in params if k not in names)
        if unknown:
            raise ValueError(f"params: {unknown} are not stage names of pipeline {spec.name!r}; "
                             f"stages: {', '.join(names)}")
        by_stage = {names[name]: p for name, p in params.items() if p is not None}
    else:
        by_stage = {stage.id: params for stage in stages if _params_kind(params) == stage.kind}
        if not by_stage:
            raise ValueError(f"params: {type(params).__name__} is for {_params_kind(params) or 'no'} stages, and "
                             f"pipeline {spec.name!r} has none ({spec.describe_stages()})")
    for stage_id, p in by_stage.items():
        stage = spec.get_stage(stage_id)
        expected = _PARAMS_BY_KIND.get(stage.kind)
        if expected is not None and _params_kind(p) != stage.kind:
            raise ValueError(f"params for stage {stage.label}: expected {expected}, got {type(p).__name__}")
    return by_stage


_PARAMS_BY_KIND = {"diffusion": "DiffusionParams", "ar": "SamplingParams"}


def _params_kind(params: Any) -> str | None:
    from omnistage.ar.sampling_params import SamplingParams
    from omnistage.diffusion.params import DiffusionParams

    if isinstance(params, DiffusionParams):
        return "diffusion"
    if isinstance(params, SamplingParams):
        return "ar"
    return None


def _is_prompt_list(prompts: Any) -> bool:
    return isinstance(prompts, Sequence) and not isinstance(prompts, str)


def _prompt_list(prompts: Any) -> list[Any]:
    if not isinstance(prompts, Sequence) or isinstance(prompts, str):
        return [prompts]
    prompts = list(prompts)
    if any(isinstance(p, Mapping) and "role" in p for p in prompts):
        raise ValueError("prompts: this looks like one list of chat messages; pass [messages] for one "
                         "conversation, or a list of conversations")
    return prompts
