"""A tiny pipeline with the native seams, for driving the runtime without a model.

Latents are [n, 3, H, W] noise from the request's own generator; each step pulls them
toward a colour derived from the prompt, so results depend only on (prompt, seed, steps),
never on batching. Prompts starting with "fail-encode" / "fail-step" / "fail-decode" raise
there. `fake.json` in the model folder may set `step_delay` (seconds per denoise_step).
`PanickingPipeline`'s encode raises a BaseException for prompts starting with "panic", as
a tokenizer's pyo3 PanicException does: it kills an `executor: mp` worker.
"""

from __future__ import annotations

import json
import time
import zlib
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from omnistage.diffusion.accel.declaration import Accelerations
from omnistage.diffusion.params import ExtraSpec
from omnistage.diffusion.pipeline import DenoiseState, DiffusionPipelineBase
from omnistage.diffusion.request import DiffusionRequest


class FakePipeline(DiffusionPipelineBase):
    reference_class: ClassVar[str] = "FakePipeline"
    default_params: ClassVar[dict[str, Any]] = {"height": 16, "width": 16, "num_inference_steps": 3,
                                                 "guidance_scale": 1.0}
    extras: ClassVar[dict[str, ExtraSpec]] = {"strength": ExtraSpec(float, default=0.5, min=0.0, max=1.0)}
    # The runtime tests start two ranks through cfg_parallel_size; its from_pretrained applies nothing.
    supported_accelerations: ClassVar[Accelerations] = Accelerations(cfg_parallel=True)

    def __init__(self, components: dict[str, Any], device="cpu", dtype=torch.float32, step_delay: float = 0.0):
        super().__init__(components, device, dtype)
        self.step_delay = step_delay
        self.num_denoise_calls = 0
        self.batch_sizes: list[int] = []

    @classmethod
    def from_pretrained(cls, path, device="cpu", dtype=torch.float32, deploy=None) -> "FakePipeline":
        config_file = Path(path) / "fake.json"
        config = json.loads(config_file.read_text()) if config_file.is_file() else {}
        return cls({"scheduler": None}, device, dtype, step_delay=config.get("step_delay", 0.0))

    def check_inputs(self, request: DiffusionRequest) -> None:
        super().check_inputs(request)
        for name in ("height", "width"):
            if getattr(request.params, name) % 8:
                raise ValueError(f"{name} must be divisible by 8, got {getattr(request.params, name)}")

    def encode(self, requests: list[DiffusionRequest]) -> list[DenoiseState]:
        states = []
        for request in requests:
            if request.prompt.startswith("fail-encode"):
                raise RuntimeError("fake encode failure")
            p = request.params
            latents = torch.randn((p.num_outputs_per_prompt, 3, p.height, p.width), generator=self.generator_for(request))
            target = torch.tensor([(zlib.crc32(request.prompt.encode()) >> s & 255) / 255 for s in (0, 8, 16)])
            states.append(DenoiseState(request, latents.to(self.device), None,
                                       torch.arange(p.num_inference_steps, 0, -1),
                                       cond={"target": target.view(1, 3, 1, 1).to(self.device)}))
        return states

    def denoise_step(self, states: list[DenoiseState]) -> None:
        self.num_denoise_calls += 1
        self.batch_sizes.append(len(states))
        if self.step_delay:
            time.sleep(self.step_delay)
        for s in states:
            if s.request.prompt.startswith("fail-step"):
                raise RuntimeError("fake denoise failure")
            strength = s.request.params.extras["strength"]
            s.latents = s.latents + strength * (s.cond["target"] - s.latents)
            s.step_index += 1

    def decode_arrays(self, states: list[DenoiseState]) -> list[np.ndarray]:
        if any(s.request.prompt.startswith("fail-decode") for s in states):
            raise RuntimeError("fake decode failure")
        return [s.latents.clamp(0, 1).permute(0, 2, 3, 1).cpu().numpy() for s in states]


class FakeRequestOnlyPipeline(FakePipeline):
    max_batch_size: ClassVar[int | None] = 1


class PanicException(BaseException):
    """What pyo3 raises when Rust code panics (not an Exception: nothing catches it by accident)."""


class PanickingPipeline(FakePipeline):
    def encode(self, requests: list[DiffusionRequest]) -> list[DenoiseState]:
        if any(r.prompt.startswith("panic") for r in requests):
            raise PanicException("capacity overflow")
        return super().encode(requests)


def make_fake_model(path: Path, step_delay: float = 0.0) -> str:
    """Write a model folder for FakePipeline into `path`."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "model_index.json").write_text(json.dumps({"_class_name": "FakePipeline"}))
    (path / "fake.json").write_text(json.dumps({"step_delay": step_delay}))
    return str(path)


def child_pids() -> set[int]:
    """This process's live stage and worker processes (omnistage titles them "omni:..."), not
    multiprocessing's own helpers (the fork server and resource tracker live as long as the
    interpreter)."""
    import psutil

    pids = set()
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.status() != psutil.STATUS_ZOMBIE and proc.name().startswith("omni:"):
                pids.add(proc.pid)
        except psutil.NoSuchProcess:
            pass
    return pids
