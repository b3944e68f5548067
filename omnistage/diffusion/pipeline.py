"""The seam between the diffusion runtime and one model family.

A native pipeline is built from diffusers components (transformer, VAE, text encoders,
scheduler) and splits generation the way diffusers' modular pipelines do:

    encode(requests)      -> one DenoiseState per request (text/image conditioning,
                             initial latents, its own noise scheduler with timesteps set)
    denoise_step(states)  -> advance every state by one step, in batched transformer calls
    decode(states)        -> one ImagePayload / VideoPayload per request

so the runtime runs one denoising step per engine step in both scheduling modes, and the
step scheduler can add and drop requests between steps. `forward(requests)` runs the
whole loop in one call (offline use and tests). Batching never changes a request's result: every
request draws its noise from its own generator seeded with its own seed.
"""

from __future__ import annotations

import copy
import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch

from omnistage.config.deploy_fields import StageDeployConfig
from omnistage.core.errors import RequestError
from omnistage.core.types import ImagePayload, VideoPayload
from omnistage.diffusion.accel.declaration import NONE, Accelerations, check_declared
from omnistage.diffusion.checkpoint import CheckpointConfigs
from omnistage.diffusion.guidance import Guidance, Predict, guided_predictions
from omnistage.core.lora import unknown_adapter
from omnistage.diffusion.params import DiffusionParams, ExtraSpec, fill_defaults, validate_extras
from omnistage.diffusion.request import DiffusionRequest


@dataclass
class DenoiseState:
    """Per-request state carried between denoising steps. Pipelines own `cond`'s keys."""

    request: DiffusionRequest
    latents: torch.Tensor  # [num_outputs_per_prompt, ...]
    noise_scheduler: Any  # this request's own copy of the diffusers noise scheduler, timesteps already set
    timesteps: torch.Tensor
    cond: dict[str, Any] = field(default_factory=dict)  # prompt embeds, masks, image latents, ...
    step_index: int = 0
    num_forwards: int = 0
    """Transformer forwards asked for this request (one per branch per step)."""
    step_cache: Any = None
    """The step cache's state for this request (accel/step_cache.py StepCacheState); None
    until a cache first sees it, so every request starts with an empty cache."""

    @property
    def num_forwards_skipped(self) -> int:
        return 0 if self.step_cache is None else self.step_cache.num_skipped

    @property
    def num_steps(self) -> int:
        return len(self.timesteps)

    @property
    def is_done(self) -> bool:
        return self.step_index >= self.num_steps


ProgressCallback = Callable[[list[DenoiseState]], None]
StepRunner = Callable[[list[DenoiseState], Callable[[list[DenoiseState]], None]], None]

_ATTRIBUTES = {"scheduler": "noise_scheduler"}
"""Components held under another attribute name than their diffusers one: here `scheduler`
is the engine's batch scheduler, so the diffusers noise scheduler is `noise_scheduler`."""


def run_step(states: list[DenoiseState], denoise_step: Callable[[list[DenoiseState]], None]) -> None:
    """The default step runner: every state in one `denoise_step`."""
    denoise_step(states)


class DiffusionPipelineBase(ABC):
    """Base for native pipelines. Subclasses declare the class attributes below."""

    reference_class: ClassVar[str]
    """The diffusers pipeline class this one reproduces (model_index.json `_class_name`)."""
    output_modality: ClassVar[str] = "image"  # "image" | "video"
    default_params: ClassVar[dict[str, Any]] = {}
    """Defaults for DiffusionParams fields left as None (diffusers' own call defaults); a family
    whose defaults depend on the checkpoint sets them per instance in `configure`."""
    extras: ClassVar[dict[str, ExtraSpec]] = {}
    """Model-declared request extras (e.g. max_sequence_length)."""
    needs_image: ClassVar[bool] = False
    """Whether a request must carry an input image (edit, I2V)."""
    takes_image: ClassVar[bool] = False
    """Whether a request may carry input images without needing one (FLUX.2's reference images)."""
    takes_video: ClassVar[bool] = False
    """Whether a request may carry a control video and its mask (Wan-VACE)."""
    guidance: ClassVar[Guidance | None] = None
    """How classifier-free guidance runs for this family (guidance.py); None = no CFG branches."""
    step_cache_blocks: ClassVar[Any] = None
    """Where the transformer runs its blocks, for the step caches (accel/step_cache.BlockChain);
    None = step caches are refused."""
    supported_accelerations: ClassVar[Accelerations] = NONE
    """The accelerations the family takes (accel/declaration.py); any other is refused by name."""
    takes_prompt_updates: ClassVar[bool] = False
    """Whether a running request's prompt may change (`update_prompt`): a pipeline that makes
    its output in chunks (Helios) applies it from the next chunk."""
    max_batch_size: ClassVar[int | None] = None
    """Most requests that may run at once; None = no limit (the generic adapter takes 1)."""

    def __init__(self, components: dict[str, Any], device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32, configs: CheckpointConfigs | None = None):
        self.components = components
        self.device = torch.device(device)
        self.dtype = dtype
        for name, module in components.items():
            setattr(self, _ATTRIBUTES.get(name, name), module)
        self.accelerations: list[str] = []
        """What `from_pretrained` applied from the deploy config (e.g. ["vae_tiling"])."""
        self.guidance_runner = guided_predictions
        """Runs `guidance` for a step; CFG-parallel replaces it (accel/cfg_parallel.py), a step
        cache wraps it (accel/step_cache.py)."""
        self.step_cache: Any = None
        """The step cache applied from the deploy config, if any (accel/step_cache.py)."""
        self.vae_decode: Callable[[torch.Tensor], torch.Tensor] = lambda z: self.vae.decode(z, return_dict=False)[0]
        """Scaled latents -> the VAE's decoded output; VAE patch parallel replaces it (accel/vae_patch_parallel.py)."""
        self.vae_encode: Callable[[torch.Tensor], Any] = lambda pixels: self.vae.encode(pixels)
        """Pixels -> the VAE's encode output (its `latent_dist`): how a family encodes an input image;
        VAE patch parallel replaces it (accel/vae_patch_parallel.py)."""
        self.step_runner: StepRunner = run_step
        """Runs `denoise_step` over one step's states; per-request LoRA replaces it to split
        them by adapter (accel/lora.py)."""
        self.lora_adapters: tuple[str, ...] = ()
        """Names of the LoRA adapters a request may choose (`lora_adapters` deploy field)."""
        self.max_loras = 0
        """Most adapters loaded by path (`max_loras` deploy field); above 0, the engine's LoraSet
        checks a request's adapter (core/lora.py), since only it knows which it loaded."""
        self.deploy_defaults: dict[str, Any] = {}
        """The stage's deploy `default_sampling_params`: they win over `request_defaults()`."""
        configs = configs or CheckpointConfigs({}, {})
        self.configure(configs)
        # Extras that name their text components are capped by the checkpoint's token limits.
        self.extras = {name: spec.bounded_by(configs.max_text_tokens(spec.max_from)) if spec.max_from else spec
                       for name, spec in self.extras.items()}

    def configure(self, configs: CheckpointConfigs) -> None:
        """Read the checkpoint facts that requests are checked against (size multiples, default
        size, guidance kind) from its config files. It runs in the loaded pipeline and, without
        any weights, in the engine process (`for_requests`), so everything `prepare_request`,
        `check_inputs` and `batch_key` use must come from here or from class attributes."""

    @classmethod
    def for_requests(cls, configs: CheckpointConfigs, deploy: StageDeployConfig | None = None) -> "DiffusionPipelineBase":
        """An instance without components that validates requests for the checkpoint whose
        config files are `configs` (and the LoRA adapters `deploy` preloads): what the engine
        checks every request against before queueing it."""
        checker = cls.__new__(cls)
        DiffusionPipelineBase.__init__(checker, {}, "cpu", torch.float32, configs)
        if deploy is not None:
            checker.lora_adapters = tuple(sorted(deploy.lora_adapters))
            checker.max_loras = deploy.max_loras
            checker.deploy_defaults = dict(deploy.default_sampling_params)
        return checker

    # -- loading -------------------------------------------------------------------------

    @classmethod
    def read_configs(cls, path: str) -> CheckpointConfigs:
        """The checkpoint's config files, read without weights: a diffusers folder's by default;
        a family whose checkpoint is no diffusers folder reads its own."""
        return CheckpointConfigs.read(path)

    loader_overrides: ClassVar[dict[str, Any]] = {}
    """Components diffusers' loader is given instead of loading them (e.g. {"processor": None})."""

    @classmethod
    def loader_kwargs(cls, path: str) -> dict[str, Any]:
        """What diffusers' loader is given for the checkpoint at `path`: `loader_overrides`, or
        components a family must build from the folder itself (e.g. a processor transformers
        cannot construct here)."""
        return dict(cls.loader_overrides)

    @classmethod
    def from_pretrained(cls, path: str, device: torch.device | str | None = None, dtype: torch.dtype | None = None,
                        deploy: StageDeployConfig | None = None) -> "DiffusionPipelineBase":
        """The one load path: diffusers' own classes load the folder (or hub id) as its
        model_index.json names them, `from_diffusers` builds the pipeline from them, and the
        stage's accelerations (`deploy`) are applied to it, all in one place. `device` and
        `dtype` default to the deploy config's (`devices[0]`, `dtype`), as the engine resolves them."""
        from diffusers import DiffusionPipeline

        from omnistage.diffusion import transformer_file
        from omnistage.diffusion.accel import apply_accelerations
        from omnistage.core.device import canonical_device, resolve_device, resolve_dtype

        deploy = deploy or StageDeployConfig()
        check_declared(cls.reference_class, cls.supported_accelerations, deploy)  # before the weights load
        device = resolve_device(deploy.devices) if device is None else canonical_device(device)
        dtype = resolve_dtype(deploy.dtype, device) if dtype is None else dtype
        components = cls.loader_kwargs(str(path))
        if deploy.transformer_file is not None:  # a GGUF file in place of the folder's transformer
            components["transformer"] = transformer_file.load(str(path), deploy, dtype)
        pipe = DiffusionPipeline.from_pretrained(str(path), dtype=dtype, **components)
        if deploy.offload is None and deploy.fsdp_degree == 1:  # offloaded weights wait on the CPU (accel/offload.py)
            pipe = pipe.to(device)
        elif deploy.offload is None:  # FSDP moves the transformers a shard at a time (accel/fsdp.py): whole,
            for name, component in pipe.components.items():  # they may not fit the device
                if isinstance(component, torch.nn.Module) and name not in ("transformer", "transformer_2"):
                    component.to(device)
        pipeline = cls.from_diffusers(pipe, str(path), CheckpointConfigs.read(str(path)), device, dtype)
        pipeline.deploy_defaults = dict(deploy.default_sampling_params)
        pipeline.accelerations = apply_accelerations(pipeline, deploy)
        return pipeline

    @classmethod
    def from_diffusers(cls, pipe: Any, path: str, configs: CheckpointConfigs, device: torch.device | str,
                       dtype: torch.dtype) -> "DiffusionPipelineBase":
        """The hook for a family that needs more from the checkpoint than its components (e.g.
        a processor): build the pipeline from the loaded diffusers one."""
        return cls(pipe.components, device, dtype, configs)

    # -- request checks ------------------------------------------------------------------

    def request_defaults(self) -> dict[str, Any]:
        """What a field a request leaves unset takes (after the deploy's defaults): the family's
        call defaults and its declared extras' defaults. `prepare_params` fills them and
        /v1/models lists them, so the two cannot differ."""
        extras = {name: spec.default for name, spec in self.extras.items() if spec.default is not None}
        return {**self.default_params, **({"extras": extras} if extras else {})}

    def prepare_params(self, params: DiffusionParams) -> DiffusionParams:
        """Fill defaults (the deploy's, then the family's) and validate extras; raises
        ValueError naming the field."""
        params = fill_defaults(params, self.deploy_defaults, self.request_defaults())
        if params.lora is not None and not self.max_loras:
            if params.lora.path is not None:
                raise RequestError("lora.path", "lora.path: this stage loads no adapter by path (deploy max_loras: 0)")
            if params.lora.name not in self.lora_adapters:
                raise unknown_adapter(params.lora.name, self.lora_adapters)
        return params.model_copy(update={"extras": validate_extras(params.extras, self.extras)})

    def check_inputs(self, request: DiffusionRequest) -> None:
        """Raise ValueError naming the offending field. Override to add family rules."""
        if self.needs_image and not request.images:
            raise RequestError("image", "image: this model needs an input image")
        if not (self.needs_image or self.takes_image) and request.images:
            raise RequestError("image", "image: this model does not take an input image")
        for name in ("video", "mask"):
            if getattr(request, name) and not self.takes_video:
                raise RequestError(name, f"{name}: this model does not take a control video")

    def prepare_request(self, request: DiffusionRequest) -> DiffusionRequest:
        """The request with defaults filled and extras validated, after `check_inputs`. It runs
        once per request: in the engine, before queueing (so `encode` takes prepared requests),
        or in `denoise` for the whole-loop path."""
        request = dataclasses.replace(request, params=self.prepare_params(request.params))
        self.check_inputs(request)
        return request

    def batch_key(self, params: DiffusionParams) -> tuple:
        """Requests whose keys match may share one request-mode batch."""
        return (params.height, params.width, params.num_frames, params.num_inference_steps,
                params.guidance_scale, params.true_cfg_scale, params.guidance_scale_2, params.lora,
                tuple(sorted(params.extras.items())))

    # -- the three seams -----------------------------------------------------------------

    @abstractmethod
    def encode(self, requests: list[DiffusionRequest]) -> list[DenoiseState]:
        """Prompt embeddings, initial noise and timesteps of each request, already prepared
        (`prepare_request`)."""

    @abstractmethod
    def denoise_step(self, states: list[DenoiseState]) -> None:
        """Advance each (unfinished) state by exactly one step. States may differ in step
        count and position; group them by shape where one transformer call cannot mix them."""

    @abstractmethod
    def decode_arrays(self, states: list[DenoiseState]) -> list[np.ndarray]:
        """Decode finished states to float arrays in [0, 1], one per state: images
        [num_outputs, H, W, 3], video [num_frames, H, W, 3]. Parity tests compare these
        with diffusers' `output_type="np"`."""

    def step(self, states: list[DenoiseState]) -> None:
        """One denoising step over `states`, through the step runner (what the runtime calls)."""
        self.step_runner(states, self.denoise_step)

    def guided_predictions(self, states: list[DenoiseState], predict: Predict) -> list[torch.Tensor]:
        """Each state's guided noise prediction for its current step: `predict` runs the
        transformer over (state, branch) rows; the family's `guidance` says which and how."""
        def counted(rows: Any) -> list[torch.Tensor]:
            preds = predict(rows)  # counted once it returns: a step cache may retry a split call
            for state, _ in rows:
                state.num_forwards += 1
            return preds

        return self.guidance_runner(states, counted, self.guidance)

    def state_metrics(self, state: DenoiseState) -> dict[str, int]:
        """What a finished request reports beyond the engine's timings: its transformer forwards
        computed and skipped (the generic adapter runs diffusers' loop and counts none)."""
        if not state.num_forwards:
            return {}
        skipped = state.num_forwards_skipped
        return {"num_forwards_computed": state.num_forwards - skipped, "num_forwards_skipped": skipped}

    def update_prompt(self, state: DenoiseState, update: dict[str, Any]) -> None:
        """A new prompt for a running request: {"event_id", "prompt", "transition_chunks"}
        (only where `takes_prompt_updates`)."""
        raise NotImplementedError(f"{type(self).__name__} takes no prompt updates")

    def take_chunks(self, states: list[DenoiseState]) -> list[tuple[DenoiseState, Any]]:
        """The pieces of output (a VideoPayload with `is_chunk`) the last step finished for
        `states`, each handed out once, to stream before the request ends. Only a pipeline that
        makes its output in pieces (Helios) has any."""
        return []

    def release(self, state: DenoiseState) -> None:
        """`state` left the runner (finished, failed or aborted): free what it holds beyond its
        tensors (the generic adapter ends its diffusers call)."""

    def decode(self, states: list[DenoiseState]) -> list[Any]:
        """Decode finished states into one ImagePayload / VideoPayload per state."""
        return [self.to_payload(arr, state.request) for state, arr in zip(states, self.decode_arrays(states))]

    def to_payload(self, arr: np.ndarray, request: DiffusionRequest) -> Any:
        """One decoded float array in [0, 1] -> the ImagePayload / VideoPayload the engine returns."""
        from PIL import Image

        uint8 = (np.clip(arr, 0.0, 1.0) * 255).round().astype(np.uint8)
        if self.output_modality == "video":
            fps = request.params.fps or self.default_params.get("fps", 16)
            return VideoPayload(frames=uint8, fps=float(fps))
        return ImagePayload(images=[Image.fromarray(img) for img in uint8])

    def to_av_payload(self, video: np.ndarray, audio: np.ndarray, request: DiffusionRequest,
                      sample_rate: int) -> VideoPayload:
        """`to_payload` of a decoded video with its soundtrack (audio [channels, samples] floats),
        for a family that makes both (LTX-2, Kandinsky 6)."""
        payload = self.to_payload(video, request)
        return VideoPayload(frames=payload.frames, fps=payload.fps, audio=audio.astype(np.float32),
                            sample_rate=sample_rate)

    # -- the whole loop in one call (offline use and tests; the runtime steps the seams) ----

    @torch.no_grad()
    def forward(self, requests: list[DiffusionRequest], on_step: ProgressCallback | None = None) -> list[Any]:
        return self.decode(self.denoise(requests, on_step))

    @torch.no_grad()
    def denoise(self, requests: list[DiffusionRequest], on_step: ProgressCallback | None = None) -> list[DenoiseState]:
        """`forward` before decoding: encode, then batched steps until every state is done.
        Parity tests decode its states with `decode_arrays` to compare floats, not uint8."""
        states = self.encode([self.prepare_request(r) for r in requests])
        while True:
            running = [s for s in states if not s.is_done]
            if not running:
                break
            self.step(running)
            if on_step is not None:
                on_step(running)
        return states

    # -- helpers shared by the families --------------------------------------------------

    def generator_for(self, request: DiffusionRequest) -> torch.Generator:
        """The request's own noise source, on CPU like diffusers' tests (device-independent)."""
        seed = request.params.seed if request.params.seed is not None else torch.seed() % 2**63
        return torch.Generator("cpu").manual_seed(seed)

    def noise_scheduler_copy(self) -> Any:
        """A private noise scheduler per request: diffusers schedulers keep the step index inside."""
        return copy.deepcopy(self.noise_scheduler)

    @staticmethod
    def noise_scheduler_step(state: DenoiseState, noise_pred: torch.Tensor) -> None:
        """Advance `state` one step with its own noise scheduler (x_t -> x_t-1) given its noise prediction."""
        t = state.timesteps[state.step_index]
        state.latents = state.noise_scheduler.step(noise_pred, t, state.latents, return_dict=False)[0]
        state.step_index += 1

    def guided_steps(self, states: list[DenoiseState], call_key: Callable[[DenoiseState], Any], predict: Predict,
                     step: Callable[[DenoiseState, torch.Tensor], None] | None = None) -> None:
        """One denoising step for `states`: one guided prediction (`predict` over the family's
        branches) per group of states with equal `call_key`, what one transformer call needs its
        states to share (latent grid, prompt length); then `step` (default: the state's own noise
        scheduler) applies each state's prediction."""
        step = step or self.noise_scheduler_step
        for group in group_by(states, call_key):
            for state, pred in zip(group, self.guided_predictions(group, predict)):
                step(state, pred)


# -- module-level helpers shared by the families ---------------------------------------------


def check_divisible(params: DiffusionParams, **multiples: int) -> None:
    """Raise ValueError naming the first field in `multiples` (field name -> divisor) whose value
    in `params` it does not divide; unset fields pass. diffusers warns and rounds sizes down; we
    refuse, so the output has the size asked for."""
    for name, multiple in multiples.items():
        value = getattr(params, name)
        if value is not None and value % multiple != 0:
            raise RequestError(name, f"{name} must be divisible by {multiple}, got {value}")


def check_video_frames(params: DiffusionParams, temporal: int) -> None:
    """One video per request, of 4k+1 frames for a VAE that folds `temporal` frames into one
    latent frame after the first. diffusers rounds the count down; we refuse it."""
    if (params.num_frames - 1) % temporal != 0:
        raise RequestError("num_frames", f"num_frames - 1 must be divisible by {temporal}, "
                           f"got num_frames={params.num_frames}")
    if params.num_outputs_per_prompt != 1:
        raise RequestError("num_outputs_per_prompt",
                           f"num_outputs_per_prompt must be 1 for video, got {params.num_outputs_per_prompt}")


def check_one_image(request: DiffusionRequest) -> None:
    """Exactly one input image, a PIL image (image-to-video)."""
    import PIL.Image

    if len(request.images) != 1:
        raise RequestError("image", f"image: expected exactly one input image, got {len(request.images)}")
    if not isinstance(request.images[0], PIL.Image.Image):
        raise RequestError("image", f"image: must be a PIL image, got {type(request.images[0]).__name__}")


def encode_prompt_pairs(requests: list[DiffusionRequest], uses_cfg: Callable[[DiffusionRequest], bool],
                        encode: Callable[[list[str]], Sequence[Any]],
                        default_negative: str = "") -> list[tuple[Any, Any | None]]:
    """(prompt row, negative-prompt row or None) per request, from one `encode(texts)` call over
    their prompts followed by the negative prompts (`default_negative` unless given) of those
    that `uses_cfg`; `encode` returns one row per text."""
    guided = [i for i, r in enumerate(requests) if uses_cfg(r)]
    texts = [r.prompt for r in requests] + [requests[i].params.negative_prompt or default_negative for i in guided]
    rows = encode(texts)
    negatives = dict(zip(guided, rows[len(requests):]))
    return [(row, negatives.get(i)) for i, row in enumerate(rows[: len(requests)])]


def encode_prompts_by_length(requests: list[DiffusionRequest], uses_cfg: Callable[[DiffusionRequest], bool],
                             encode: Callable[[list[str], int], Sequence[Any]],
                             default_negative: str = "") -> list[tuple[Any, Any | None]]:
    """`encode_prompt_pairs`, with one `encode(texts, max_sequence_length)` call per group of
    requests with the same max_sequence_length."""
    out: list[Any] = [None] * len(requests)
    for max_len in sorted({r.params.extras["max_sequence_length"] for r in requests}):
        group = [i for i, r in enumerate(requests) if r.params.extras["max_sequence_length"] == max_len]
        pairs = encode_prompt_pairs([requests[i] for i in group], uses_cfg, lambda texts: encode(texts, max_len),
                                    default_negative)
        for i, pair in zip(group, pairs):
            out[i] = pair
    return out


def repeat_per_output(embeds: torch.Tensor | None, num_outputs: int) -> torch.Tensor | None:
    """One prompt's embeddings (or None: no negative prompt) repeated for each of the request's
    `num_outputs` latents, as a view: [num_outputs, *embeds.shape]."""
    return None if embeds is None else embeds.unsqueeze(0).expand(num_outputs, *embeds.shape)


def pooled_prompt_cond(prompt: tuple[torch.Tensor, torch.Tensor], negative: tuple[torch.Tensor, torch.Tensor] | None,
                       num_outputs: int) -> dict[str, torch.Tensor | None]:
    """The cond entries of a (sequence embeddings, pooled embeddings) prompt and of its negative
    (None without CFG), each repeated for the request's `num_outputs` latents (Flux, SD3)."""
    negative_embeds, negative_pooled = negative if negative is not None else (None, None)
    return {
        "prompt_embeds": repeat_per_output(prompt[0], num_outputs),
        "pooled_prompt_embeds": repeat_per_output(prompt[1], num_outputs),
        "negative_prompt_embeds": repeat_per_output(negative_embeds, num_outputs),
        "negative_pooled_prompt_embeds": repeat_per_output(negative_pooled, num_outputs),
    }


def decode_images(vae: Any, image_processor: Any, latents: torch.Tensor,
                  states: list[DenoiseState], decode: Callable[[torch.Tensor], torch.Tensor]) -> list[np.ndarray]:
    """[B, C, H, W] latents of `states` -> float images in [0, 1], one [n, H, W, 3] array per
    state: undo the VAE's scaling and shift factors, decode, postprocess (Flux, SD3, Z-Image)."""
    latents = latents / vae.config.scaling_factor + vae.config.shift_factor
    images = decode(latents.to(vae.dtype))
    return split_per_state(image_processor.postprocess(images, output_type="np"), states)


def image_size(state: DenoiseState) -> tuple[int, int]:
    """The (height, width) a state's request asks for: states with equal ones have equal latent
    grids, so they share a VAE call (and, with equal prompt lengths, a transformer call)."""
    return state.request.params.height, state.request.params.width


def latent_shape(state: DenoiseState) -> tuple[int, ...]:
    """The shape of one of a state's latents: states with equal ones may share a VAE call, and a
    transformer call where prompt lengths may differ or are fixed."""
    return tuple(state.latents.shape[1:])


def grid_and_prompt_length(state: DenoiseState) -> tuple[int, int, int]:
    """`image_size` and the prompt's token count: states with equal ones may share a transformer
    call whose position ids (text, then the image grid: 32x64 and 64x32 have equal token counts
    but not equal ids) are shared across the call."""
    return (*image_size(state), state.cond["prompt_embeds"].shape[1])


def group_by(states: Iterable[DenoiseState], key: Callable[[DenoiseState], Any]) -> list[list[DenoiseState]]:
    """Split states into lists with equal `key`, keeping their order."""
    groups: dict[Any, list[DenoiseState]] = {}
    for s in states:
        groups.setdefault(key(s), []).append(s)
    return list(groups.values())


def map_groups(states: list[DenoiseState], key: Callable[[DenoiseState], Any],
               fn: Callable[[list[DenoiseState]], list[Any]]) -> list[Any]:
    """Run `fn` once per group of states with equal `key` (e.g. one batched VAE call per
    image size); return its per-state results in the order of `states`."""
    results: dict[int, Any] = {}
    for group in group_by(states, key):
        results.update(zip(map(id, group), fn(group)))
    return [results[id(s)] for s in states]


def current_timesteps(states: list[DenoiseState]) -> torch.Tensor:
    """Each state's current timestep, repeated for each of its latents: the per-sample timestep
    tensor a transformer call over `torch.cat([s.latents for s in states])` needs."""
    return torch.cat([s.timesteps[s.step_index].expand(s.latents.shape[0]) for s in states])


def split_per_state(batch: Any, states: list[DenoiseState]) -> list[Any]:
    """Cut a batch built from `torch.cat([s.latents for s in states])` (a tensor or array with
    the same leading rows) back into one piece per state."""
    pieces, offset = [], 0
    for s in states:
        n = s.latents.shape[0]
        pieces.append(batch[offset: offset + n])
        offset += n
    return pieces


def flow_sigmas(noise_scheduler: Any, num_steps: int) -> np.ndarray | None:
    """FLUX's sigmas, 1 down to 1/num_steps; None for a noise scheduler that builds its own flow
    sigmas (e.g. UniPC with use_flow_sigmas), which takes only the step count."""
    if noise_scheduler.config.get("use_flow_sigmas", False):
        return None
    return np.linspace(1.0, 1 / num_steps, num_steps)


def set_flow_match_timesteps(noise_scheduler: Any, sigmas: Any, image_seq_len: int,
                             device: torch.device | str | None = None, num_steps: int | None = None) -> torch.Tensor:
    """Set a flow-matching noise scheduler to `sigmas` with the resolution-dependent shift `mu`
    (Flux, Qwen-Image, Z-Image), read from the checkpoint's scheduler config like diffusers does.
    `sigmas=None` gives a noise scheduler that builds its own flow sigmas (e.g. UniPC with
    use_flow_sigmas) only the step count, `num_steps`.
    Returns the timesteps; the step index starts at 0 (no timestep lookup per step)."""
    from diffusers.pipelines.flux.pipeline_flux import calculate_shift, retrieve_timesteps

    mu = calculate_shift(
        image_seq_len,
        noise_scheduler.config.get("base_image_seq_len", 256),
        noise_scheduler.config.get("max_image_seq_len", 4096),
        noise_scheduler.config.get("base_shift", 0.5),
        noise_scheduler.config.get("max_shift", 1.15),
    )
    num_steps = len(sigmas) if sigmas is not None else num_steps
    timesteps, _ = retrieve_timesteps(noise_scheduler, num_steps, device, sigmas=sigmas, mu=mu)
    noise_scheduler.set_begin_index(0)
    return timesteps


def latent_grid(params: DiffusionParams, multiple_of: int) -> tuple[int, int]:
    """(height, width) of a request's unpacked VAE latents for a transformer that reads them in
    2x2 patches (`multiple_of` = twice the VAE's factor): even, so they pack."""
    return 2 * (params.height // multiple_of), 2 * (params.width // multiple_of)


def pack_latents(latents: torch.Tensor, patch_size: int = 2) -> torch.Tensor:
    """[B, C, H, W] -> [B, (H/p)*(W/p), C*p*p]: p x p patches as tokens, in row-major grid order
    (Flux and Qwen-Image with p=2, Krea 2 with its checkpoint's p)."""
    b, c, h, w = latents.shape
    p = patch_size
    latents = latents.view(b, c, h // p, p, w // p, p).permute(0, 2, 4, 1, 3, 5)
    return latents.reshape(b, (h // p) * (w // p), c * p * p)


def unpack_latents(latents: torch.Tensor, height: int, width: int, patch_size: int = 2) -> torch.Tensor:
    """The inverse of `pack_latents` for a latent grid of `height` x `width`: -> [B, C, H, W]."""
    b, _, channels = latents.shape
    p = patch_size
    latents = latents.view(b, height // p, width // p, channels // (p * p), p, p).permute(0, 3, 1, 4, 2, 5)
    return latents.reshape(b, channels // (p * p), height, width)

