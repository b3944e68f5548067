"""Weight updates and sleep level 2 on a real generation stage (Qwen3-TTS's codec decoder; the zoo's
seeds 0 and 1 are the same shapes with other weights): an update from a checkpoint folder or from
tensors makes the stage decode as a fresh load of the new weights does, and sleep level 2 frees
the decoder's weights and reads them back to the same audio."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from omnistage.config.deploy_fields import StageDeployConfig
from omnistage.core.types import StageRequest
from omnistage.generation.engine import GenerationEngine
from omnistage.models.qwen3_tts import STAGES

CODEC = STAGES[1]


@pytest.fixture(scope="module")
def paths(zoo):
    return str(zoo("qwen3-tts-custom-voice")), str(zoo("qwen3-tts-custom-voice", seed=1))


def engine(path: str) -> GenerationEngine:
    return GenerationEngine(path, CODEC, StageDeployConfig(devices=("cpu",)))


def decode(eng: GenerationEngine, codes: torch.Tensor) -> np.ndarray:
    eng.add_request(StageRequest("r", {"codes": codes}))
    pieces = []
    while eng.has_unfinished_requests():
        pieces += [out.payload.audio for out in eng.step() if out.payload is not None]
    return np.concatenate(pieces)


@pytest.fixture(scope="module")
def codes(paths):
    eng = engine(paths[0])
    try:
        return torch.randint(0, eng.decoder.codebook_size, (12, eng.decoder.num_quantizers),
                             generator=torch.Generator().manual_seed(0))
    finally:
        eng.close()


def test_an_update_from_a_folder_or_tensors_decodes_as_a_fresh_load(paths, codes):
    old_path, new_path = paths
    fresh_new = engine(new_path)
    want = decode(fresh_new, codes)
    eng = engine(old_path)
    before = decode(eng, codes)
    assert not np.array_equal(before, want)  # the two checkpoints sound different

    assert eng.update_weights(new_path) == len(fresh_new.decoder.model.state_dict())
    np.testing.assert_array_equal(decode(eng, codes), want)

    old = engine(old_path)
    eng.update_weights(tensors=dict(old.decoder.model.state_dict()))
    np.testing.assert_array_equal(decode(eng, codes), before)
    with pytest.raises(ValueError, match="does not have"):
        eng.update_weights(tensors={"no.such.weight": torch.zeros(1)})
    with pytest.raises(RuntimeError, match="sleep level 2 reads the weights back"):
        eng.sleep(2)  # updated from tensors: no folder holds them
    for e in (fresh_new, eng, old):
        e.close()


def test_sleep_level_2_frees_the_decoder_and_wakes_to_the_same_audio(paths, codes):
    eng = engine(paths[0])
    before = decode(eng, codes)
    weights = [p for p in eng.decoder.model.parameters() if p.numel()]
    num_bytes = sum(p.numel() * p.element_size() for p in weights)
    assert eng.sleep(2) >= num_bytes > 0
    assert all(p.numel() == 0 for p in weights)
    with pytest.raises(RuntimeError, match="level 2"):
        eng.update_weights(paths[1])
    eng.wake_up()
    np.testing.assert_array_equal(decode(eng, codes), before)
    eng.close()
