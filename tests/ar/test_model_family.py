"""A model family plugs its own forward into the AR engine through `register_ar_model`."""

from __future__ import annotations

import pytest

from ar_helpers import PROMPTS, final, make_engine, run
from omnistage.ar.engine import AREngine
from omnistage.ar.hf_model import HFCausalLM
from omnistage.ar.model import ModelOutput, PromptInputs, get_ar_model_class, register_ar_model
from omnistage.ar.sampling_params import SamplingParams
from omnistage.config.deploy_fields import StageDeployConfig
from omnistage.config.spec import StageSpec
from omnistage.core.types import StageRequest


class EmbedsFamily(HFCausalLM):
    """Builds `inputs_embeds` itself (as Qwen2.5-Omni's talker does), keeps per-request state,
    and returns a per-step extra from the post-sampling hook (as CSM's depth decoder would)."""

    supports_packed_batch = False  # its forward reads the padded layouts only

    def build_prompt(self, inputs) -> PromptInputs:
        prompt = super().build_prompt(inputs["text"])
        prompt.model_state = {"scale": inputs["scale"], "steps": 0}
        return prompt

    def forward(self, batch, cache) -> ModelOutput:
        embeds = self.model.get_input_embeddings()(batch.input_ids)
        scale = embeds.new_tensor([s.model_state["scale"] for s in batch.seqs])
        self.seen_scales = getattr(self, "seen_scales", set()) | set(scale.tolist())
        keep = batch.last_indices[:, None] if batch.last_indices is not None else 1
        out = self.model(inputs_embeds=embeds * scale[:, None, None], position_ids=batch.positions,
                         attention_mask={"full_attention": batch.attention_mask}, cache=cache,
                         logits_to_keep=keep)
        return ModelOutput(logits=out.logits[:, -1])

    def on_sampled(self, batch, output, token_ids):
        extras = []
        for seq in batch.seqs:
            seq.model_state["steps"] += 1
            extras.append({"step": seq.model_state["steps"]})
        return extras


register_ar_model("tests.embeds_family", EmbedsFamily)
STAGE = StageSpec(id=0, name="talker", kind="ar", output="tokens", model="tests.embeds_family")
GREEDY = SamplingParams(max_tokens=8, temperature=0.0)


def test_family_forward_state_and_extras(llm_path):
    family = AREngine(llm_path, STAGE, StageDeployConfig(devices=("cpu",), max_num_seqs=4))
    plain = make_engine(llm_path, max_num_seqs=4)
    reqs = [StageRequest(f"f{i}", {"text": p, "scale": 1.0 if i % 2 else 0.5}, GREEDY) for i, p in enumerate(PROMPTS)]
    outputs = run(family, reqs)
    expected = run(plain, [StageRequest(f"f{i}", p, GREEDY) for i, p in enumerate(PROMPTS)])
    for i in range(4):
        tokens = final(outputs, f"f{i}").token_ids
        if i % 2:  # scale 1: the same model as the generic runner
            assert tokens == final(expected, f"f{i}").token_ids
        assert [o.payload.extras["step"] for o in outputs[f"f{i}"]] == list(range(1, 9))
    assert family.model.seen_scales == {0.5, 1.0}  # the per-request state reached the family's forward


def test_unknown_family_key_lists_the_registered_ones():
    with pytest.raises(ValueError, match="tests.embeds_family"):
        get_ar_model_class("tests.no_such_family")
    with pytest.raises(ValueError, match="already registered"):
        register_ar_model("tests.embeds_family", HFCausalLM)
