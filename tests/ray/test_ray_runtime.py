"""`runtime: ray` and `connector: ray` on the two-node test cluster (conftest.py): Qwen2.5-Omni
with its thinker and vocoder on one node and its talker on the other, every payload through
the Ray object store (threshold 0), streams the same audio chunks and ends with the same
text (token for token) and waveform (up to float rounding) as the inline pipeline; a stage actor that is killed makes the stage
unhealthy within seconds, and the stage comes back and serves the same result again."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import numpy as np
import pytest
import torch
import yaml

from omnistage import Omni, SamplingParams
from omnistage.core.types import AudioPayload, StageOutput
from omnistage.runtime.channel import Channel
from omnistage.models.qwen2_5_omni import Token2WavParams
from omnistage.testing.speech_models import DEFAULT_GENERATE_KWARGS
from ray_nodes import node_names

KW = DEFAULT_GENERATE_KWARGS["qwen2.5-omni"]
MESSAGES = [{"role": "user", "content": "Hello, who are you?"}]
NUM_CODES = 96  # with chunks of 36 codes: three audio chunks stream before the end
PLACEMENT = {0: "node_a", 1: "node_b", 2: "node_a"}  # thinker, talker, vocoder

# The actors run one intra-op thread (Ray's default for num_cpus=1); so does the inline reference.
pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.slow]


def params() -> dict:
    return {
        "thinker": SamplingParams(temperature=0, max_tokens=KW["thinker_max_new_tokens"]),
        "talker": SamplingParams(temperature=0, max_tokens=NUM_CODES, min_tokens=NUM_CODES,
                                 repetition_penalty=KW["talker_repetition_penalty"]),
        "token2wav": Token2WavParams(seed=1234, num_steps=KW["token2wav_num_steps"], chunk_size=36),
    }


def close(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal up to float rounding: the vocoder's sums may run in another order in another process
    (its waveform is ~1e-8 in size, so compare relative to it)."""
    return a.shape == b.shape and float(np.linalg.norm(a - b) / np.linalg.norm(b)) < 1e-4


def streamed(omni: Omni) -> tuple[list[np.ndarray], object]:
    async def collect():
        chunks, last = [], None
        async for out in omni.async_omni.generate({"messages": MESSAGES}, params()):
            if out.audio_chunk is not None:
                chunks.append(out.audio_chunk)
            last = out
        return chunks, last

    return asyncio.run(collect())


def test_ray_channel_moves_tensors_arrays_and_images_through_the_object_store(ray_cluster):
    from PIL import Image

    connector = Channel("ray", threshold_bytes=1024)
    image = Image.fromarray(np.arange(48 * 48 * 3, dtype=np.uint8).reshape(48, 48, 3))
    payload = {"t": torch.arange(4096, dtype=torch.float32).reshape(64, 64), "a": np.ones(3000, np.int16),
               "img": image, "out": StageOutput("r", AudioPayload(np.zeros(2048, np.float32), 24000), finished=True)}
    sent = connector.put(payload)
    assert sent.ref is not None and not sent.buffers
    got = connector.get(sent)
    assert torch.equal(got["t"], payload["t"]) and np.array_equal(got["a"], payload["a"])
    got["t"][0, 0] = -1  # the receiver's copy is its own
    assert np.array_equal(np.asarray(got["img"]), np.asarray(image))
    assert got["out"].payload.audio.shape == (2048,) and got["out"].finished
    small = connector.put({"small": 1})  # below the threshold: inline
    assert small.ref is None and connector.get(small) == {"small": 1}


def test_omni_spread_over_two_nodes_matches_inline_and_a_killed_stage_comes_back(ray_cluster, zoo, tmp_path):
    """About 30 s (28 s in a quiet parallel run on two cores, 50 s in a loaded one): the inline reference,
    then three stage actors that each import torch and load their model on a fresh Ray worker,
    then a restarted vocoder actor doing the same again. Splitting it would start the actors
    twice."""
    path = str(zoo("qwen2.5-omni"))
    with Omni(path) as omni:
        want_chunks, want = streamed(omni)
    assert want.error is None and len(want_chunks) == 3

    deploy = tmp_path / "ray.yaml"
    deploy.write_text(yaml.safe_dump({
        "base_config": "bundled:qwen2_5_omni.yaml", "connector": "ray", "shm_threshold_bytes": 0,
        "stages": [{"id": i, "runtime": "ray", "ray_resources": {node: 1}} for i, node in PLACEMENT.items()],
    }))
    with Omni(path, deploy) as omni:
        handles = omni.async_omni.orchestrator.handles
        names = node_names()
        assert {i: names[handles[i].endpoint.node_id] for i in PLACEMENT} == PLACEMENT
        assert os.getpid() not in {handles[i].endpoint.pid for i in PLACEMENT}
        chunks, last = streamed(omni)
        assert last.error is None and last.token_ids == want.token_ids and last.text == want.text
        assert [len(c) for c in chunks] == [len(c) for c in want_chunks]
        for got, expected in zip(chunks, want_chunks):
            assert close(got, expected)
        assert close(last.audio, want.audio)

        vocoder = handles[2]
        os.kill(vocoder.endpoint.pid, signal.SIGKILL)
        started = time.monotonic()
        while omni.async_omni.orchestrator.check_health():
            assert time.monotonic() < started + 10, "the killed stage still looks healthy"
            time.sleep(0.05)
        while not omni.async_omni.orchestrator.check_health():
            assert time.monotonic() < started + 120, "the stage did not come back"
            time.sleep(0.1)
        assert vocoder.num_restarts == 1
        _, again = streamed(omni)
        assert again.error is None and again.token_ids == want.token_ids
        assert close(again.audio, want.audio)
