"""DiffusionEngine on the tiny Stable Audio zoo checkpoint: step mode (requests join and one
is aborted between steps) and a request-mode batch give each request the waveform it gets
alone, as an AudioPayload of [samples, channels] at the VAE's rate."""

from __future__ import annotations

import numpy as np
import pytest

from omnistage.config.deploy_fields import StageDeployConfig
from omnistage.core.types import AudioPayload, StageRequest
from omnistage.diffusion.engine import DiffusionEngine
from omnistage.diffusion.params import DiffusionParams
from omnistage.models.stable_audio.pipeline import StableAudio

PROMPTS = ["rain on a roof", "a dog barking twice in a large empty hall", "wind"]


def req(rid: str, prompt: str, seed: int, steps: int = 3, seconds: float = 0.5) -> StageRequest:
    params = DiffusionParams(num_inference_steps=steps, guidance_scale=5.0, seed=seed, negative_prompt="noise",
                             extras={"audio_end_in_s": seconds})
    return StageRequest(rid, prompt, params)


def run(engine: DiffusionEngine) -> dict[str, list]:
    outputs: dict[str, list] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            outputs.setdefault(out.request_id, []).append(out)
    return outputs


def waveform(output) -> np.ndarray:
    assert output.finished and output.error is None, output.error
    assert isinstance(output.payload, AudioPayload) and output.payload.sample_rate == 8000
    return output.payload.audio


@pytest.fixture(scope="module")
def path(zoo):
    return zoo("stable-audio")


@pytest.fixture(scope="module")
def alone(path):
    engine = DiffusionEngine(path)
    assert engine.pipeline_cls is StableAudio
    audio = {}
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(req(f"r{i}", prompt, seed=i, seconds=0.25 * (i + 1)))
        audio[i] = waveform(run(engine)[f"r{i}"][-1])
    engine.close()
    return audio


def test_request_mode_batch_matches_alone(path, alone):
    engine = DiffusionEngine(path, config=StageDeployConfig(max_num_seqs=4, request_batch_max_wait_ms=50))
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(req(f"r{i}", prompt, seed=i, seconds=0.25 * (i + 1)))
    outs = run(engine)
    for i in range(3):
        final = outs[f"r{i}"][-1]
        assert final.metrics["batch_size"] == 3  # different durations share the batch
        assert waveform(final).shape == (2000 * (i + 1), 2)
        assert np.abs(waveform(final) - alone[i]).max() <= 1e-4
    engine.close()


def test_step_mode_staggered_joins_and_abort_match_alone(path, alone):
    engine = DiffusionEngine(path, config=StageDeployConfig(step_execution=True, max_num_seqs=4))
    outs: dict[str, list] = {}

    def tick():
        for out in engine.step():
            outs.setdefault(out.request_id, []).append(out)

    engine.add_request(req("r0", PROMPTS[0], seed=0, seconds=0.25))
    engine.add_request(req("gone", "to be aborted", seed=9, steps=6))
    tick()
    engine.add_request(req("r1", PROMPTS[1], seed=1, seconds=0.5))
    tick()
    engine.abort_request("gone")
    engine.add_request(req("r2", PROMPTS[2], seed=2, seconds=0.75))
    while engine.has_unfinished_requests():
        tick()
    assert not any(o.finished for o in outs["gone"])
    assert engine.executor.worker.runner.states == {}
    for i in range(3):
        assert np.abs(waveform(outs[f"r{i}"][-1]) - alone[i]).max() <= 1e-4
    engine.close()
