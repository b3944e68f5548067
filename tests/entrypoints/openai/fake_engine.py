"""A fake engine client with AsyncOmni's surface, and apps built around it.

The fake yields real `OmniOutput`s (progress, text deltas, audio chunks, media) so the
routes run their whole path in-process; only the model is missing.
"""

from __future__ import annotations

import asyncio

import numpy as np
from fastapi.testclient import TestClient
from PIL import Image

from omnistage.ar.sampling_params import SamplingParams
from omnistage.config.spec import PipelineSpec, StageSpec
from omnistage.core.errors import ErrorKind
from omnistage.core.types import ProgressPayload
from omnistage.diffusion.params import DiffusionParams, ExtraSpec, validate_extras
from omnistage.engine.outputs import OmniOutput
from omnistage.entrypoints.openai.api_server import ServerSettings, create_app

EXTRAS = {"max_sequence_length": ExtraSpec(int, default=64, min=1, max=512)}
SAMPLE_RATE = 16000
TEXT = ["Hello", " from", " the", " fake", " model."]
# What Qwen3-ASR writes when it detects the language itself (kind "asr").
ASR_TEXT = ["language", " English", "<asr_text>", *TEXT]


def spec(kind: str) -> PipelineSpec:
    if kind == "image":
        stages = [StageSpec(id=0, name="diffusion", kind="diffusion", output="image", final_output=True)]
    elif kind == "video":
        stages = [StageSpec(id=0, name="diffusion", kind="diffusion", output="video", final_output=True)]
    elif kind == "text":
        stages = [StageSpec(id=0, name="llm", kind="ar", output="text", final_output=True)]
    elif kind == "omni":
        stages = [StageSpec(id=0, name="thinker", kind="ar", output="text", final_output=True),
                  StageSpec(id=1, name="talker", kind="ar", output="tokens", inputs=(0,)),
                  StageSpec(id=2, name="vocoder", kind="generation", output="audio", inputs=(1,), final_output=True)]
    elif kind == "asr":  # the real family's spec: its speech_to_text builds prompts and reads answers
        from omnistage.models.qwen3_asr import QWEN3_ASR

        return QWEN3_ASR
    elif kind == "tts":
        stages = [StageSpec(id=0, name="talker", kind="ar", output="tokens"),
                  StageSpec(id=1, name="codec", kind="generation", output="audio", inputs=(0,), final_output=True)]
    else:
        raise KeyError(kind)
    return PipelineSpec(name=f"fake-{kind}", stages=tuple(stages))


class FakeEngine:
    """Yields what a `kind` pipeline would: progress then media for diffusion, text deltas,
    audio chunks. `step_delay` slows each output (to test aborts and queue limits)."""

    def __init__(self, kind: str, step_delay: float = 0.0, num_steps: int = 4):
        self.kind = kind
        self.spec = spec(kind)
        self.step_delay = step_delay
        self.num_steps = num_steps
        self.requests: list[tuple[object, object, str]] = []
        self.aborted: list[str] = []
        self.raw_params: list[object] = []
        self.modalities: list[tuple[str, ...] | None] = []
        """Each request's `modalities`, as the route passed them."""
        self.session_ids: list[str | None] = []
        """Each request's `session_id` (the body's `user`), as the route passed it."""
        self.healthy = True
        self.is_shut_down = False
        self.text = list(ASR_TEXT if kind == "asr" else TEXT)
        """The pieces a text answer streams (tests set tool-call text here)."""
        self.finish_reason = "stop"
        """What the text outputs end with ("abort" to play an aborted request)."""

    async def generate(self, prompt, params=None, request_id=None, *, modalities=None, session_id=None):
        # As AsyncOmni: structural checks raise on the first iteration, before queueing;
        # an engine refusing the request in add_request comes back as an error output.
        self.raw_params.append(params)
        self.modalities.append(None if modalities is None else tuple(modalities))
        self.session_ids.append(session_id)
        if isinstance(params, dict):
            params = params.get(self.spec.entry_stages[0].name)
        if params is not None and not isinstance(params, (SamplingParams, DiffusionParams)):
            raise ValueError(f"params: unexpected {type(params).__name__}")
        if isinstance(params, DiffusionParams):
            try:
                validate_extras(params.extras, EXTRAS)
            except ValueError as e:
                yield OmniOutput(request_id, finished=True, finish_reason="error",
                                 error=f"stage 0 (diffusion): add_request raised ValueError: {e}",
                                 error_kind=ErrorKind.INVALID_REQUEST)
                return
        self.requests.append((prompt, params, request_id))
        if self.kind in ("image", "video"):
            for step in range(1, self.num_steps + 1):
                await self._tick()
                yield OmniOutput(request_id, progress=ProgressPayload(step, self.num_steps), stage="diffusion")
            h, w = (params.height or 16, params.width or 24) if params else (16, 24)
            if self.kind == "image":
                n = params.num_outputs_per_prompt if params else 1
                images = [Image.new("RGB", (w, h), (40 * i, 100, 200)) for i in range(n)]
                yield OmniOutput(request_id, finished=True, images=images, finish_reason="stop")
            else:
                frames = np.zeros(((params.num_frames or 5), h, w, 3), dtype=np.uint8)
                frames[:, :, :, 0] = np.arange(frames.shape[0])[:, None, None] * 20
                yield OmniOutput(request_id, finished=True, video=frames, fps=params.fps or 8.0, finish_reason="stop")
            return
        text = ""
        if self.kind in ("text", "omni", "asr"):
            limit = params.max_tokens if isinstance(params, SamplingParams) and params.max_tokens else len(self.text)
            for piece in self.text[:limit]:
                await self._tick()
                text += piece
                yield OmniOutput(request_id, text=text, text_delta=piece, stage="thinker")
        chunks = []
        if self.kind in ("omni", "tts") and (modalities is None or "audio" in modalities):
            for i in range(3):
                await self._tick()
                chunk = np.full(800, 0.1 * (i + 1), dtype=np.float32)
                chunks.append(chunk)
                yield OmniOutput(request_id, audio_chunk=chunk, sample_rate=SAMPLE_RATE, stage="vocoder")
        audio = np.concatenate(chunks) if chunks else None
        token_ids = list(range(len(self.text))) if text else None
        yield OmniOutput(request_id, finished=True, text=text or None, token_ids=token_ids,
                         audio=audio, sample_rate=SAMPLE_RATE if chunks else None, finish_reason=self.finish_reason,
                         metrics={"e2e_time": 0.01, "num_prompt_tokens": 7, "stages": {}})

    async def _tick(self) -> None:
        await asyncio.sleep(self.step_delay)

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)

    async def check_health(self) -> bool:
        return self.healthy

    async def shutdown(self) -> None:
        self.is_shut_down = True


def make_client(kind: str, **settings) -> tuple[TestClient, FakeEngine]:
    engine = FakeEngine(kind, step_delay=settings.pop("step_delay", 0.0))
    app = create_app(ServerSettings(served_model_name=f"fake-{kind}", model_path=f"/models/fake-{kind}", **settings),
                     engine)
    return TestClient(app), engine
