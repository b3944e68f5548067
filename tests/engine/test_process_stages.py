"""Stages in their own processes: payloads through shared memory, abort, crash, start-up
failure. The orchestrator runs its background loop, as under AsyncOmni."""

from __future__ import annotations

import functools
import os
import threading

import pytest
from fake_engines import SPEC, Collector, FakeEngine, expand_to_image

from omnistage.config import PipelineSpec, StageDeployConfig, StageSpec
from omnistage.engine.orchestrator import OmniRequest, Orchestrator

PROCESS = StageDeployConfig(runtime="process")


def start(factory=FakeEngine, configs=None, **kwargs) -> Orchestrator:
    orch = Orchestrator(SPEC, "m", configs or {1: PROCESS}, engine_factory=factory, **kwargs)
    orch.start()
    return orch


def shm_left(prefix: str) -> list[str]:
    return [n for n in os.listdir("/dev/shm") if n.startswith(prefix)] if os.path.isdir("/dev/shm") else []


def test_large_payloads_cross_through_shared_memory_and_are_freed():
    # 256x256 RGB = 192 KiB: above the 64 KiB threshold, so the image comes back via shm
    orch = start(functools.partial(FakeEngine, image_size=256), connector="shm")
    prefix = orch.handles[1].endpoint.channel.prefix[:-1]
    got = Collector()
    orch.submit(OmniRequest("r", "a cat"), got.sink("r"))
    final = got.wait("r")
    assert final.error is None
    assert final.images[0].size == (256, 256) and final.images[0].info["prompt"] == "expander(a cat)"
    assert [o.progress.step for o in got.outputs["r"][:-1]] == [1, 2]
    assert orch.check_health()
    orch.close()
    assert shm_left(prefix) == []


def test_abort_in_a_process_stage_and_crash_fails_its_requests_without_hanging():
    orch = start(functools.partial(FakeEngine, num_steps=1000, step_delay=0.01), connector="shm",
                 shm_threshold_bytes=0)  # every message through shm: aborts must still free them
    prefix = orch.handles[1].endpoint.channel.prefix[:-1]
    got = Collector()
    orch.submit(OmniRequest("slow", "slow"), got.sink("slow"))
    # wait until the drawer is denoising, then abort
    while not any(o.progress for o in got.outputs["slow"]):
        threading.Event().wait(0.01)
    orch.abort("slow")
    assert got.wait("slow").finish_reason == "abort"

    orch.submit(OmniRequest("boom", "crash:drawer"), got.sink("boom"))
    boom = got.wait("boom")
    assert boom.stage == "drawer" and boom.error.startswith("stage 1 (drawer): stage process died (exit code 3)")
    assert not orch.check_health()
    # the dead stage fails new requests at once
    orch.submit(OmniRequest("after", "x"), got.sink("after"))
    assert "died" in got.wait("after").error
    orch.close()
    assert shm_left(prefix) == []


def failing_factory(model_path, stage, config):
    if stage.id == 1:
        raise OSError(f"no weights at {model_path}")
    return FakeEngine(model_path, stage, config)


def test_a_stage_that_cannot_start_fails_start_up_naming_it():
    with pytest.raises(RuntimeError, match=r"stage 1 \(drawer\) failed to start:(.|\n)*OSError: no weights at m"):
        Orchestrator(SPEC, "m", {1: PROCESS}, engine_factory=failing_factory)


def with_callback_for_x(request, upstream):
    inputs = expand_to_image(request, upstream)
    return {**inputs, "callback": lambda: None} if request.prompt == "x" else inputs


def test_a_payload_that_cannot_be_pickled_fails_only_its_request():
    spec = PipelineSpec("t2i", (
        StageSpec(0, "expander", "ar", "text"),
        StageSpec(1, "drawer", "diffusion", "image", inputs=(0,), final_output=True,
                  input_processor=with_callback_for_x),
    ))
    orch = Orchestrator(spec, "m", {1: PROCESS}, engine_factory=FakeEngine, connector="inline")
    orch.start()
    got = Collector()
    orch.submit(OmniRequest("bad", "x"), got.sink("bad"))  # the drawer's input holds a lambda
    orch.submit(OmniRequest("good", "y"), got.sink("good"))
    bad = got.wait("bad")
    assert bad.error.startswith("stage 1 (drawer): cannot send the request to the stage process: ")
    assert got.wait("good").images and orch.check_health()
    orch.close()
