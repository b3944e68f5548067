"""Fake engines with the real `Engine` protocol, for orchestrator tests without models.

`FakeEngine` answers by the stage's output modality, one output per step:
- "text": the string `"{stage name}({input text})"` in `num_tokens` pieces (TextPayload);
- "image": `num_steps` ProgressPayloads, then one RGB image of `image_size` whose
  `info["prompt"]` is the input text, `info["pid"]` the engine's process and `info["devices"]`
  its config's devices (ImagePayload);
- "audio": one AudioPayload of 10 samples per input character;
- "video": like "image", then a VideoPayload of 3 frames of `image_size` at 8 fps.

Inputs whose text contains a trigger word misbehave: "poison" makes `add_request` raise,
"explode" makes `step` raise, "crash" kills the process, "fail" makes the engine return
an error output (a refusal after it was queued), "die" makes `step` raise WorkerDiedError and the engine turn unhealthy (as
a diffusion engine whose worker process died), "panic" makes `step` raise a BaseException
(as a tokenizer's pyo3 PanicException); "linger" makes an image or video request take 10 times
`num_steps`; "crash:drawer" only in the stage named drawer. Module-level and picklable, so process stages can run it
(`functools.partial(FakeEngine, step_delay=...)` is a factory too).

Two small pipelines to run them in: `text_to_image()` (an AR stage whose text becomes
a diffusion prompt, whole hand-off) and `streamed_tts()` (an AR stage streaming its text
in chunks to an audio stage; both final). `Collector` gathers outputs of a running
orchestrator per request.
"""

from __future__ import annotations

import os
import re
import threading
import time
from typing import Any

import numpy as np
from PIL import Image

from omnistage.config import PipelineSpec, StageSpec
from omnistage.core.types import (
    AudioPayload,
    ImagePayload,
    ProgressPayload,
    StageOutput,
    StageRequest,
    TextPayload,
    VideoPayload,
)
from omnistage.runtime.process import WorkerDiedError


class PanicException(BaseException):
    """What pyo3 raises when Rust code panics (e.g. a tokenizer's "capacity overflow")."""


def input_text(inputs: Any) -> str:
    if isinstance(inputs, str):
        return inputs
    if isinstance(inputs, TextPayload):
        return inputs.text
    if isinstance(inputs, dict):
        if "prompt" in inputs:
            return str(inputs["prompt"])
        return "+".join(input_text(v) for _, v in sorted(inputs.items()))
    return repr(inputs)


class FakeEngine:
    def __init__(self, model_path: str, stage: Any, config: Any, *, num_tokens: int = 4, num_steps: int = 2,
                 image_size: int = 8, step_delay: float = 0.0):
        self.model_path = model_path
        self.stage = stage
        self.config = config
        self.num_tokens = num_tokens
        self.num_steps = num_steps
        self.image_size = image_size
        self.step_delay = step_delay
        self.running: dict[str, dict[str, Any]] = {}
        self.aborted: list[str] = []
        self.added: list[str] = []
        self.params: dict[str, Any] = {}
        self.closed = False
        self.dead = False
        self.asleep = False

    @classmethod
    def request_checker(cls, model_path: str, stage: Any, config: Any):
        """What `add_request` refuses, checked before queueing (as DiffusionEngine offers)."""
        def check(request: StageRequest) -> None:
            if _triggered(stage, "poison", input_text(request.inputs)):
                raise ValueError(f"poisoned input {input_text(request.inputs)!r}")

        return check

    def add_request(self, request: StageRequest) -> None:
        text = input_text(request.inputs)
        if self._triggered("poison", text):
            raise ValueError(f"poisoned input {text!r}")
        self.added.append(request.request_id)
        self.params[request.request_id] = request.params
        self.running[request.request_id] = {"text": text, "n": 0, "params": request.params}

    def abort_request(self, request_id: str) -> None:
        if self.running.pop(request_id, None) is not None:
            self.aborted.append(request_id)

    def has_unfinished_requests(self) -> bool:
        return bool(self.running)

    def step(self) -> list[StageOutput]:
        if self.step_delay:
            time.sleep(self.step_delay)
        outputs = []
        if any(self._triggered("die", state["text"]) for state in self.running.values()):
            self.dead = True
        if self.dead:
            raise WorkerDiedError("a worker died")
        for rid, state in list(self.running.items()):
            if self._triggered("panic", state["text"]):
                raise PanicException("capacity overflow")
            if self._triggered("crash", state["text"]):
                os._exit(3)
            if self._triggered("explode", state["text"]):
                raise RuntimeError("the engine exploded")
            if self._triggered("fail", state["text"]):
                del self.running[rid]
                outputs.append(StageOutput(rid, None, finished=True, error="the fake engine failed"))
                continue
            state["n"] += 1
            out = self._output(rid, state)
            if out.finished:
                del self.running[rid]
            outputs.append(out)
        return outputs

    def _triggered(self, word: str, text: str) -> bool:
        return _triggered(self.stage, word, text)

    def _output(self, rid: str, state: dict[str, Any]) -> StageOutput:
        kind, n, text = self.stage.output, state["n"], state["text"]
        if kind == "text":
            target = f"{self.stage.name}({text})"
            cut = lambda i: len(target) * i // self.num_tokens  # noqa: E731
            finished = n == self.num_tokens
            payload = TextPayload(token_ids=list(range(n)), text=target[:cut(n)], delta_token_ids=[n - 1],
                                  delta_text=target[cut(n - 1):cut(n)], finish_reason="stop" if finished else None)
            return StageOutput(rid, payload, finished, metrics={"num_generated_tokens": n} if finished else {})
        if kind == "image":
            num_steps = self.num_steps * (10 if self._triggered("linger", text) else 1)
            if n <= num_steps:
                return StageOutput(rid, ProgressPayload(n, num_steps), False)
            image = Image.new("RGB", (self.image_size, self.image_size), (len(text) % 256, 0, 0))
            image.info["prompt"] = text
            image.info["pid"] = os.getpid()  # which replica drew it
            image.info["devices"] = list(self.config.devices)  # and on what devices its config put it
            return StageOutput(rid, ImagePayload([image]), True, metrics={"queue_time": 0.0, "num_steps": self.num_steps})
        if kind == "audio":
            return StageOutput(rid, AudioPayload(np.full(10 * len(text), 0.5, np.float32), 16000), True)
        if kind == "video":
            if n <= self.num_steps:
                return StageOutput(rid, ProgressPayload(n, self.num_steps), False)
            frames = np.full((3, self.image_size, self.image_size, 3), len(text) % 256, np.uint8)
            return StageOutput(rid, VideoPayload(frames, 8.0), True, metrics={"num_steps": self.num_steps})
        raise ValueError(f"FakeEngine cannot make {kind!r}")

    def is_healthy(self) -> bool:
        return not self.closed and not self.dead

    def sleep(self, level: int) -> int:
        if self.running:
            raise RuntimeError(f"sleep: {len(self.running)} request(s) are still running")
        self.asleep = True
        return 1000  # "bytes freed", so a caller can count the engines that slept

    def wake_up(self) -> None:
        self.asleep = False

    def is_sleeping(self) -> bool:
        return self.asleep

    def update_weights(self, path: str | None, tensors: dict | None) -> int:
        """Records where its weights came from (`weights_from`, read by a control call)."""
        if self.running:
            raise RuntimeError(f"update_weights: {len(self.running)} request(s) are still running")
        self.weights = path if path is not None else sorted(tensors)
        return 7

    def weights_from(self) -> Any:
        return getattr(self, "weights", None)

    def request_ids(self) -> list[str]:
        """Every request id this engine was given (a control call reads it from a stage process)."""
        return list(self.added)

    def close(self) -> None:
        self.closed = True


def _triggered(stage: Any, word: str, text: str) -> bool:
    return any(name in ("", stage.name) for name in re.findall(rf"{word}(?::(\w+))?", text))


def expand_to_image(request, upstream):
    return {"prompt": upstream[0].text}


def every_token(request, payload, finished):
    """Chunk processor: each new piece of text becomes a chunk."""
    if payload is None or not payload.delta_text:
        return None
    return TextPayload(token_ids=payload.delta_token_ids, text=payload.delta_text)


def text_to_image() -> PipelineSpec:
    return PipelineSpec("t2i", (
        StageSpec(0, "expander", "ar", "text"),
        StageSpec(1, "drawer", "diffusion", "image", inputs=(0,), final_output=True, input_processor=expand_to_image),
    ))


def streamed_tts() -> PipelineSpec:
    return PipelineSpec("tts", (
        StageSpec(0, "talker", "ar", "text", final_output=True, chunk_processor=every_token),
        StageSpec(1, "vocoder", "generation", "audio", inputs=(0,), final_output=True, stream_input=True),
    ))


SPEC = text_to_image()


class Collector:
    """A sink per request; `wait(rid)` blocks until that request's last output."""

    def __init__(self):
        self.outputs: dict[str, list] = {}
        self._done: dict[str, threading.Event] = {}

    def sink(self, request_id: str):
        self.outputs[request_id] = []
        self._done[request_id] = threading.Event()

        def deliver(out):
            self.outputs[request_id].append(out)
            if out.finished:
                self._done[request_id].set()

        return deliver

    def wait(self, request_id: str, timeout: float = 60):
        assert self._done[request_id].wait(timeout), f"{request_id} did not finish"
        return self.outputs[request_id][-1]
