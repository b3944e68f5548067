"""OmniVoice's unmasking stage on the diffusion engine: one engine step is one unmasking step.

The seams: `encode` parses the request (request.py), clones its voice if it has one and
builds its conditional row with every target code masked; `denoise_step` runs one network
call over every running request (decoding.py); `decode` hands the codes to the codec stage
as a LatentPayload ([frames, codebooks]) with the gain the authors' loudness rule gives a
cloned voice.

Request fields: `num_inference_steps` is the authors' `num_step` (32), `guidance_scale` their
CFG scale (2.0), `seed` draws the position (and class) noise; extras `position_temperature`,
`class_temperature`, `t_shift` and `layer_penalty_factor` are theirs. The checkpoint
is no diffusers folder: its facts come from its config.json (`read_configs`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from omnistage.core.errors import RequestError
from omnistage.core.types import LatentPayload
from omnistage.diffusion.checkpoint import CheckpointConfigs
from omnistage.diffusion.params import ExtraSpec
from omnistage.diffusion.pipeline import DenoiseState, DiffusionPipelineBase, DiffusionRequest
from omnistage.models.omnivoice.decoding import UnmaskParams, unmask_step
from omnistage.models.omnivoice.request import parse_request

# DiffusionParams fields speech has no use for: refused rather than ignored.
_IMAGE_FIELDS = ("negative_prompt", "height", "width", "num_frames", "fps", "true_cfg_scale", "guidance_scale_2",
                 "lora")


class OmniVoicePipeline(DiffusionPipelineBase):
    reference_class: ClassVar[str] = "OmniVoice"
    output_modality: ClassVar[str] = "latent"
    default_params: ClassVar[dict[str, Any]] = {"num_inference_steps": 32, "guidance_scale": 2.0}
    extras: ClassVar[dict[str, ExtraSpec]] = {
        "position_temperature": ExtraSpec(float, default=5.0, min=0.0, max=100.0,
                                          help="Gumbel noise on which positions unmask first (0: by confidence)."),
        "class_temperature": ExtraSpec(float, default=0.0, min=0.0, max=10.0,
                                       help="Sampling temperature of the codes (0: greedy)."),
        "t_shift": ExtraSpec(float, default=0.1, min=0.001, max=10.0,
                             help="Shift of the unmasking schedule (small: more positions late)."),
        "layer_penalty_factor": ExtraSpec(float, default=5.0, min=0.0, max=100.0,
                                          help="How strongly earlier codebooks unmask first."),
    }

    @classmethod
    def read_configs(cls, path: str) -> CheckpointConfigs:
        config = json.loads((Path(path) / "config.json").read_text())
        return CheckpointConfigs({"_class_name": cls.reference_class}, {"model": config})

    @classmethod
    def from_pretrained(cls, path: str, device: torch.device | str | None = None, dtype: torch.dtype | None = None,
                        deploy: Any = None) -> OmniVoicePipeline:
        from omnistage.config.deploy_fields import StageDeployConfig
        from omnistage.core.device import canonical_device, resolve_device, resolve_dtype
        from omnistage.diffusion.accel.declaration import check_declared
        from omnistage.models.omnivoice.speaker import OmniVoiceSpeaker

        deploy = deploy or StageDeployConfig()
        check_declared(cls.reference_class, cls.supported_accelerations, deploy)
        device = resolve_device(deploy.devices) if device is None else canonical_device(device)
        dtype = resolve_dtype(deploy.dtype, device) if dtype is None else dtype
        pipeline = cls({"speaker": OmniVoiceSpeaker(path, device, dtype)}, device, dtype, cls.read_configs(path))
        pipeline.deploy_defaults = dict(deploy.default_sampling_params)
        return pipeline

    def check_inputs(self, request: DiffusionRequest) -> None:
        super().check_inputs(request)
        for name in _IMAGE_FIELDS:
            if getattr(request.params, name) is not None:
                raise RequestError(name, f"{name}: not a parameter of a speech model")
        if request.params.num_outputs_per_prompt != 1:
            raise RequestError("num_outputs_per_prompt", "num_outputs_per_prompt must be 1 for speech")
        parse_request(request.condition.get("speech", request.prompt))

    def batch_key(self, params) -> tuple:
        # Each request carries its own schedule and noise: any requests share a batch.
        return ()

    @torch.no_grad()
    def encode(self, requests: list[DiffusionRequest]) -> list[DenoiseState]:
        return [self._initial_state(r) for r in requests]

    def _initial_state(self, request: DiffusionRequest) -> DenoiseState:
        from omnistage.models.omnivoice.speaker import SpeechRequest

        parsed = parse_request(request.condition.get("speech", request.prompt))
        params, extras = request.params, request.params.extras
        voice = None
        if parsed.clip is not None:
            try:
                voice = self.speaker.voice_from_clip(parsed.clip.audio, parsed.clip.sample_rate, parsed.clip.text)
            except ValueError as e:
                raise RequestError("ref_audio", str(e)) from None
        unmask = UnmaskParams(num_step=params.num_inference_steps, guidance_scale=params.guidance_scale,
                              t_shift=extras["t_shift"], layer_penalty_factor=extras["layer_penalty_factor"],
                              position_temperature=extras["position_temperature"],
                              class_temperature=extras["class_temperature"])
        state = self.speaker.state(SpeechRequest(parsed.text, voice, parsed.instruct, seed=params.seed,
                                                 params=unmask))
        gain = voice.ref_rms / 0.1 if voice is not None and voice.ref_rms < 0.1 else 1.0
        return DenoiseState(request=request, latents=state.codes, noise_scheduler=None,
                            timesteps=torch.arange(unmask.num_step), cond={"unmask": state, "gain": gain})

    @torch.no_grad()
    def denoise_step(self, states: list[DenoiseState]) -> None:
        unmask_step(self.speaker.model, [s.cond["unmask"] for s in states])
        for state in states:
            state.step_index += 1

    def decode_arrays(self, states: list[DenoiseState]) -> list[np.ndarray]:
        return [s.cond["unmask"].codes.T.cpu().numpy() for s in states]

    def decode(self, states: list[DenoiseState]) -> list[Any]:
        return [LatentPayload(latents=torch.from_numpy(arr), extras={"gain": s.cond["gain"]})
                for s, arr in zip(states, self.decode_arrays(states))]
