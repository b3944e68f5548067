"""Serve any diffusers pipeline through its own `__call__`, one request at a time.

The fallback for families without a native pipeline (see `pipeline_class`). It maps
`DiffusionParams` onto the call's keyword arguments and reads its defaults and extras off
the `__call__` signature. A pipeline that makes a soundtrack with its video (LTX-2, Kandinsky 6)
keeps it: the VideoPayload carries the audio, so the MP4 gets an audio track.

diffusers owns the denoising loop, yet the runtime steps it one denoising step per engine
step like a native pipeline: the call runs in a thread of its own, and its
`callback_on_step_end` hands control back after every step and waits for the next
`denoise_step`. So progress is live, and an abort (`release`) ends the call at its next
step: the callback raises, which also skips the VAE decode that diffusers' own
`pipe._interrupt` would still run. A pipeline without `callback_on_step_end` runs its
whole call in the first step. The pipeline object and its noise scheduler are shared, so
one request runs at a time (`max_batch_size = 1`).
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np
import torch

from omnistage.core.errors import RequestError
from omnistage.core.types import VideoPayload
from omnistage.diffusion.checkpoint import CheckpointConfigs
from omnistage.diffusion.params import ExtraSpec
from omnistage.diffusion.pipeline import DenoiseState, DiffusionPipelineBase
from omnistage.diffusion.request import DiffusionRequest

# DiffusionParams field -> the `__call__` argument that carries it (where the names differ,
# the first one the pipeline accepts wins).
_FIELD_ARGS: dict[str, tuple[str, ...]] = {
    "negative_prompt": ("negative_prompt",),
    "height": ("height",),
    "width": ("width",),
    "num_frames": ("num_frames",),
    "num_inference_steps": ("num_inference_steps",),
    "guidance_scale": ("guidance_scale",),
    "true_cfg_scale": ("true_cfg_scale",),
    "guidance_scale_2": ("guidance_scale_2",),
    "num_outputs_per_prompt": ("num_images_per_prompt", "num_videos_per_prompt"),
    "fps": ("frame_rate", "fps"),
}
# Fields a request may set whether or not `__call__` takes them: they shape the payload too.
_PAYLOAD_FIELDS = {"num_outputs_per_prompt", "fps"}
# Arguments we set ourselves or that only steer the output plumbing: never extras.
_RESERVED_ARGS = {"prompt", "image", "generator", "output_type", "return_dict", "callback_on_step_end",
                  "callback_on_step_end_tensor_inputs", "callback", "callback_steps"}
_EXTRA_TYPES = (bool, int, float, str)


class _Released(Exception):
    """Raised inside a stepped call whose request was aborted: unwinds diffusers' loop."""


class SteppedCall:
    """One `__call__` in its own thread, paused after every denoising step.

    `advance()` lets it run one step (or to its end) and waits until it pauses again;
    `release()` makes it unwind at its next pause. `step` counts finished steps and
    `num_steps` is what the noise scheduler plans.
    """

    def __init__(self, run: Callable[[Callable | None], Any], num_steps: int, steppable: bool):
        self.num_steps = num_steps
        self.step = 0
        self.result: Any = None
        self.error: BaseException | None = None
        self.done = False
        self._go = threading.Semaphore(0)
        self._paused = threading.Semaphore(0)
        self._released = False
        self._thread = threading.Thread(target=self._main, args=(run, steppable), daemon=True,
                                        name="omnistage-diffusers-call")
        self._started = False

    def advance(self) -> None:
        if not self._started:
            self._started = True
            self._thread.start()
        else:
            self._go.release()
        self._paused.acquire()
        if self.error is not None:
            raise self.error

    def release(self) -> None:
        self._released = True
        if self._started and not self.done:
            self._go.release()
            self._thread.join(timeout=30)

    def _main(self, run: Callable[[Callable | None], Any], steppable: bool) -> None:
        try:
            self.result = run(self._on_step_end if steppable else None)
        except _Released:
            pass
        except BaseException as exc:  # noqa: BLE001 - handed to the runner's thread by advance()
            self.error = exc
        self.done = True
        self.step = self.num_steps
        self._paused.release()

    def _on_step_end(self, pipe: Any, i: int, t: Any, callback_kwargs: dict) -> dict:
        self.step = i + 1
        self.num_steps = max(len(pipe.scheduler.timesteps), self.step)  # e.g. img2img strength drops steps
        if self.step < self.num_steps:  # after the last step the call runs on to its decode
            self._paused.release()
            self._go.acquire()
        if self._released:
            raise _Released
        return {}


class GenericDiffusersPipeline(DiffusionPipelineBase):
    reference_class: ClassVar[str] = "DiffusionPipeline"  # any; the instance holds the real class name
    max_batch_size: ClassVar[int | None] = 1

    def __init__(self, pipe: Any, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                 configs: CheckpointConfigs | None = None):
        self.pipe = pipe
        super().__init__(pipe.components, device, dtype,
                         configs or CheckpointConfigs({"_class_name": type(pipe).__name__}, {}))

    def configure(self, configs: CheckpointConfigs) -> None:
        """The request rules come from the diffusers class's `__call__` signature, found by the
        checkpoint's `_class_name` (no instance needed)."""
        import diffusers

        self.reference_class = configs.class_name
        pipe = getattr(self, "pipe", None)  # None in the engine's request checker (for_requests)
        pipeline_cls = type(pipe) if pipe is not None else getattr(diffusers, self.reference_class, None)
        if pipeline_cls is None:
            raise ValueError(f"diffusers has no pipeline class {self.reference_class!r} (model_index.json "
                             "_class_name); a custom pipeline needs a native omnistage pipeline")
        self.call_params = inspect.signature(pipeline_cls.__call__).parameters
        # field -> the argument name this pipeline uses for it
        self.field_args = {f: next((a for a in args if a in self.call_params), None) for f, args in _FIELD_ARGS.items()}
        self.output_modality = "video" if "num_frames" in self.call_params else "image"
        # A pipeline that takes `image` (img2img, edit, I2V) is served as one that needs it.
        self.needs_image = "image" in self.call_params
        self.default_params = self._signature_defaults()
        self.extras = self._signature_extras(configs)

    @classmethod
    def from_diffusers(cls, pipe: Any, path: str, configs: CheckpointConfigs, device: torch.device | str,
                       dtype: torch.dtype) -> "GenericDiffusersPipeline":
        pipe.set_progress_bar_config(disable=True)  # progress goes through the runtime's steps
        return cls(pipe, device, dtype, configs)

    def _signature_defaults(self) -> dict[str, Any]:
        """diffusers' own defaults for the fields this pipeline takes (None ones stay None:
        the pipeline derives them, e.g. height from the checkpoint)."""
        defaults = {}
        for field, arg in self.field_args.items():
            default = self.call_params[arg].default if arg else None
            if field != "num_outputs_per_prompt" and default not in (None, inspect.Parameter.empty):
                defaults[field] = default
        return defaults

    def _signature_extras(self, configs: CheckpointConfigs) -> dict[str, ExtraSpec]:
        """Every other scalar keyword of `__call__` (e.g. max_sequence_length, strength) as an extra.
        No default is declared, so only what a request sets is passed and diffusers fills the rest.
        `max_sequence_length` is capped by the roomiest tokenizer (the one it pads to)."""
        taken = _RESERVED_ARGS | {a for a in self.field_args.values() if a}
        extras = {}
        for name, param in self.call_params.items():
            default = param.default
            if name in taken or not isinstance(default, _EXTRA_TYPES):
                continue
            kind = float if param.annotation in (float, "float") else type(default)
            extras[name] = ExtraSpec(kind, help=f"{self.reference_class} argument (diffusers default {default!r})",
                                     max_from=_longest_tokenizer(configs) if name == "max_sequence_length" else ())
        return extras

    # -- 1. check inputs ----------------------------------------------------------------

    def check_inputs(self, request: DiffusionRequest) -> None:
        super().check_inputs(request)
        params = request.params
        for field, arg in self.field_args.items():
            if arg is None and field not in _PAYLOAD_FIELDS and getattr(params, field) is not None:
                raise RequestError(field, f"{field}: {self.reference_class} does not take this parameter")
        if params.num_outputs_per_prompt > 1 and (self.field_args["num_outputs_per_prompt"] is None
                                                  or self.output_modality == "video"):
            raise RequestError("num_outputs_per_prompt", f"num_outputs_per_prompt: {self.reference_class} returns one output per request")

    def call_kwargs(self, request: DiffusionRequest) -> dict[str, Any]:
        """The `__call__` keyword arguments for a prepared request: its fields, image, extras
        and a generator seeded with its seed; float arrays out."""
        params = request.params
        kwargs: dict[str, Any] = {"prompt": request.prompt}
        for field, arg in self.field_args.items():
            value = getattr(params, field)
            if arg is not None and value is not None:
                kwargs[arg] = value
        if request.images:
            kwargs["image"] = request.images[0] if len(request.images) == 1 else list(request.images)
        kwargs.update(params.extras)
        kwargs["generator"] = self.generator_for(request)
        kwargs["output_type"] = "np"
        return kwargs

    # -- the three seams, over a stepped __call__ ------------------------------------------

    def encode(self, requests: list[DiffusionRequest]) -> list[DenoiseState]:
        if len(requests) != 1:
            raise ValueError(f"{self.reference_class} through the generic adapter runs one request at a "
                             f"time, got {len(requests)}")
        request = requests[0]
        num_steps = request.params.num_inference_steps or 1
        call = SteppedCall(lambda callback: self.generate_output(request, callback), num_steps,
                           steppable="callback_on_step_end" in self.call_params)
        return [DenoiseState(request=request, latents=None, noise_scheduler=None, timesteps=torch.zeros(num_steps),
                             cond={"call": call})]

    def denoise_step(self, states: list[DenoiseState]) -> None:
        for state in states:
            call: SteppedCall = state.cond["call"]
            call.advance()
            state.timesteps = torch.zeros(call.num_steps)
            state.step_index = call.step

    def decode_arrays(self, states: list[DenoiseState]) -> list[np.ndarray]:
        return [frames for frames, _ in self._finish(states)]

    def decode(self, states: list[DenoiseState]) -> list[Any]:
        payloads = []
        for state, (frames, audio) in zip(states, self._finish(states)):
            payload = self.to_payload(frames, state.request)
            if audio is not None:
                payload = VideoPayload(frames=payload.frames, fps=payload.fps, audio=audio,
                                       sample_rate=self.audio_sample_rate)
            payloads.append(payload)
        return payloads

    def _finish(self, states: list[DenoiseState]) -> list[tuple[np.ndarray, np.ndarray | None]]:
        for state in states:
            call: SteppedCall = state.cond["call"]
            if not call.done:  # paused after its last step: let it run its decode
                call.advance()
        return [state.cond["call"].result for state in states]

    def release(self, state: DenoiseState) -> None:
        state.cond["call"].release()

    def generate_array(self, request: DiffusionRequest, callback: Callable | None = None) -> np.ndarray:
        """Run diffusers on one prepared request: float array in [0, 1], images [n, H, W, 3] or
        video [num_frames, H, W, 3]. `callback` is passed as `callback_on_step_end`."""
        return self.generate_output(request, callback)[0]

    def generate_output(self, request: DiffusionRequest,
                        callback: Callable | None = None) -> tuple[np.ndarray, np.ndarray | None]:
        """(generate_array's array, the video's soundtrack [channels, samples] float32 or None)."""
        kwargs = self.call_kwargs(request)
        if callback is not None:
            kwargs["callback_on_step_end"] = callback
        output = self.pipe(**kwargs)
        if self.output_modality != "video":
            return np.asarray(output.images), None
        audio = getattr(output, "audio", None)
        if audio is not None and self.audio_sample_rate is not None:
            audio = np.asarray(audio[0].float().cpu() if torch.is_tensor(audio[0]) else audio[0], dtype=np.float32)
        else:
            audio = None
        return np.asarray(output.frames[0]), audio

    @property
    def audio_sample_rate(self) -> int | None:
        """The rate of the soundtrack the pipeline returns: its vocoder's output rate (LTX-2), else
        its `audio_sample_rate` (Kandinsky 6); None for a pipeline without sound."""
        vocoder = getattr(self.pipe, "vocoder", None)
        rate = getattr(getattr(vocoder, "config", None), "output_sampling_rate", None)
        return int(rate) if rate else getattr(self.pipe, "audio_sample_rate", None)


def _longest_tokenizer(configs: CheckpointConfigs) -> tuple[str, ...]:
    """The tokenizer component with the highest token limit, as `ExtraSpec.max_from` (none: ())."""
    names = [n for n in configs.pipeline if n.startswith("tokenizer") and configs.has(n)
             and configs.max_text_tokens((n,)) is not None]
    return (max(names, key=lambda n: configs.max_text_tokens((n,))),) if names else ()
