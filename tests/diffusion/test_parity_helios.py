"""Helios: our HeliosT2V against diffusers' HeliosPipeline on the tiny zoo model (fp32, CPU):
alone, two batched (different prompts, seeds and CFG), and the chunks it streams, which are
the video's frames in order, each handed out once, as soon as its chunk is denoised."""

from __future__ import annotations

import numpy as np
import pytest

from parity import BATCH_PROMPTS, ReferenceFixtures, assert_rejected, max_abs_diff, request_for, run_arrays

from omnistage.core.types import VideoPayload
from omnistage.diffusion.params import DiffusionParams
from omnistage.diffusion.registry import pipeline_class
from omnistage.models.helios.pipeline import HeliosT2V
from omnistage.testing import call_kwargs as zoo_call_kwargs

# Alone, Helios runs diffusers' float operations (it matches to the bit); in a batch, the
# transformer's matmuls over two rows round differently (measured: 1.8e-5); so does a prompt
# encoded alone as an update (1.1e-5).
TOLERANCE = 1e-5
BATCH_TOLERANCE = 5e-5


def small(**fields) -> DiffusionParams:
    return DiffusionParams(**{"height": 64, "width": 64, "num_frames": 10, **fields})


@pytest.mark.usefixtures("one_thread")
class TestHelios(ReferenceFixtures):
    zoo_name = "helios"
    reference_class = "HeliosPipeline"
    pipeline_class = HeliosT2V

    @pytest.fixture(scope="class")
    @classmethod
    def call(cls):
        return dict(zoo_call_kwargs("helios"), num_inference_steps=2)  # 2 steps in each of the 2 chunks

    def test_registered_as_native(self):
        assert pipeline_class(self.reference_class) is HeliosT2V

    def test_alone_matches_diffusers_and_streams_its_chunks(self, ours, expected, call):
        # Stepped as the engine steps it, handing out the chunks after each step.
        states = ours.encode([ours.prepare_request(request_for(call, 0))])
        steps = call["num_inference_steps"]
        assert states[0].num_steps == 2 * steps  # the engine's step count covers every chunk
        pieces = []
        while not states[0].is_done:
            ours.step(states)
            new = ours.take_chunks(states)
            # A chunk comes out after the last step of its chunk, and only then.
            assert len(new) == (1 if states[0].step_index % steps == 0 else 0)
            pieces += [piece for _, piece in new]
        assert ours.take_chunks(states) == []  # each handed out once
        (got,) = ours.decode_arrays(states)
        assert got.shape == (9, 64, 64, 3)  # two chunks of 5 frames, trimmed to 4k + 1
        assert max_abs_diff(got, expected(call, 0)) <= TOLERANCE
        # The chunks are the video's frames, in order (the last one trimmed).
        assert all(isinstance(p, VideoPayload) and p.is_chunk and p.events is None for p in pieces)
        assert [len(p.frames) for p in pieces] == [5, 4]
        (whole,) = ours.decode(states)
        assert not whole.is_chunk and np.array_equal(np.concatenate([p.frames for p in pieces]), whole.frames)

    def test_two_batched_match_each_alone(self, ours, expected, call):
        calls = [dict(call, prompt=BATCH_PROMPTS[0], guidance_scale=1.0),
                 dict(call, prompt=BATCH_PROMPTS[1], negative_prompt="a dog", guidance_scale=3.0)]
        got = run_arrays(ours, [request_for(c, s, f"r{i}") for i, (c, s) in enumerate(zip(calls, (11, 22)))])
        for g, c, s in zip(got, calls, (11, 22)):
            assert max_abs_diff(g, expected(c, s)) <= BATCH_TOLERANCE
        assert max_abs_diff(got[0], got[1]) > 1e-2

    @pytest.mark.parametrize("field, params", [
        ("height", small(height=96)),  # the long-history patch needs whole 64-pixel blocks
        ("num_outputs_per_prompt", small(num_outputs_per_prompt=2)),
        ("guidance_scale_2", small(guidance_scale_2=3.0)),
        ("num_latent_frames_per_chunk", small(extras={"num_latent_frames_per_chunk": 0})),
    ])
    def test_bad_inputs_are_rejected(self, ours, field, params):
        assert_rejected(ours, field, params)

    def test_defaults_follow_diffusers(self, ours):
        params = ours.prepare_params(DiffusionParams())
        assert (params.height, params.width, params.num_frames, params.guidance_scale) == (384, 640, 132, 5.0)
        assert params.extras == {"max_sequence_length": 512, "num_latent_frames_per_chunk": 9}

    def test_a_prompt_update_moves_the_next_chunks_as_diffusers_with_those_embeddings(self, ours, reference, call):
        # Reference: diffusers' own loop, told the chunk-1 prompt embeddings by its step callback at
        # the last step of chunk 0 (halfway from the prompt's to the new prompt's: transition_chunks=2).
        import torch

        call = dict(call, guidance_scale=1.0)
        steps = call["num_inference_steps"]
        new, _ = reference.encode_prompt("a red car on a road", do_classifier_free_guidance=False,
                                         max_sequence_length=call["max_sequence_length"])
        num_calls = []

        def halfway(pipe, i, t, kwargs):
            num_calls.append(i)
            if len(num_calls) == steps:  # the last step of chunk 0
                return {"prompt_embeds": kwargs["prompt_embeds"] + (new - kwargs["prompt_embeds"]) * 0.5}
            return {}

        want = reference(**call, generator=torch.Generator("cpu").manual_seed(0), output_type="np",
                         callback_on_step_end=halfway, callback_on_step_end_tensor_inputs=["prompt_embeds"]).frames[0]

        states = ours.encode([ours.prepare_request(request_for(call, 0))])
        pieces = []
        while not states[0].is_done:
            if states[0].step_index == 1:  # mid chunk 0: applied from chunk 1
                ours.update_prompt(states[0], {"event_id": "e1", "prompt": "a red car on a road",
                                               "transition_chunks": 2})
            ours.step(states)
            pieces += [piece for _, piece in ours.take_chunks(states)]
        (got,) = ours.decode_arrays(states)
        assert max_abs_diff(got, want) <= BATCH_TOLERANCE  # measured 1.1e-5: the two encode the new prompt apart
        assert pieces[0].events is None
        assert pieces[1].events == {"started": ["e1"], "active": ["e1"], "completed": []}  # 1 of 2 chunks
