"""StageSpec / PipelineSpec validation: every rule, all problems in one ValueError."""

from __future__ import annotations

import dataclasses

import pytest
from config_helpers import chunker, stage, three_stage

from omnistage.config import PipelineSpec, StageSpec


def pipeline(*stages) -> PipelineSpec:
    return PipelineSpec(name="p", stages=tuple(stages))


def errors_of(fn) -> str:
    with pytest.raises(ValueError) as info:
        fn()
    return str(info.value)


def test_valid_three_stage_pipeline_and_queries():
    spec = three_stage()
    assert spec.stage_ids == (0, 1, 2)
    assert [s.name for s in spec.entry_stages] == ["thinker"]
    assert [s.name for s in spec.final_stages] == ["thinker", "vocoder"]
    assert [s.id for s in spec.downstream_of(0)] == [1]
    assert spec.topological_order() == (0, 1, 2)
    assert spec.get_stage(2).name == "vocoder"
    with pytest.raises(KeyError, match="no stage 7"):
        spec.get_stage(7)


def test_specs_are_frozen_and_normalised():
    s = stage(1, inputs=[0], defaults={"max_num_seqs": 2}, final_output=True)
    assert s.inputs == (0,)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.kind = "diffusion"
    with pytest.raises(TypeError):
        s.defaults["max_num_seqs"] = 3  # read-only view
    spec = PipelineSpec(name="p", stages=[stage(0, final_output=True)])
    assert isinstance(spec.stages, tuple)


def test_topological_order_follows_inputs_not_declaration():
    spec = pipeline(stage(2, inputs=(1,), final_output=True), stage(0), stage(1, inputs=(0,)))
    assert spec.topological_order() == (0, 1, 2)


def test_no_stages():
    assert "no stages" in errors_of(lambda: PipelineSpec(name="p", stages=()))


def test_duplicate_ids():
    msg = errors_of(lambda: pipeline(stage(0, final_output=True), stage(0, "again", final_output=True)))
    assert "duplicate stage ids: [0]" in msg


def test_unknown_input_and_self_input():
    msg = errors_of(lambda: pipeline(stage(0), stage(1, inputs=(0, 1, 5), final_output=True)))
    assert "stage 1 (s1) lists itself as an input" in msg
    assert "stage 1 (s1) has input 5, which is not a stage id [0, 1]" in msg


def test_cycle_is_named_in_data_flow_order():
    msg = errors_of(
        lambda: pipeline(
            stage(0),
            stage(1, inputs=(0, 3)),
            stage(2, inputs=(1,)),
            stage(3, inputs=(2,), final_output=True),
        )
    )
    assert "cycle: 1 -> 2 -> 3 -> 1" in msg or "cycle: 2 -> 3 -> 1 -> 2" in msg or "cycle: 3 -> 1 -> 2 -> 3" in msg


def test_no_entry_stage():
    msg = errors_of(lambda: pipeline(stage(0, inputs=(1,)), stage(1, inputs=(0,), final_output=True)))
    assert "no entry stage" in msg
    assert "cycle" in msg


def test_no_final_stage():
    assert "no stage has final_output=True" in errors_of(lambda: pipeline(stage(0)))


def test_dead_end_stage():
    msg = errors_of(lambda: pipeline(stage(0, final_output=True), stage(1, inputs=(0,))))
    assert "stage 1 (s1) is not final_output and feeds no stage" in msg


def test_every_graph_problem_in_one_error():
    msg = errors_of(
        lambda: pipeline(stage(0, inputs=(9,)), stage(0, "dup", inputs=(2,)), stage(2, inputs=(2,)))
    )
    for expected in ("duplicate stage ids", "has input 9", "lists itself", "no entry stage", "no stage has final_output"):
        assert expected in msg
    assert msg.startswith("invalid pipeline 'p':")


@pytest.mark.parametrize("output", ["text", "tokens", "image", "video", "audio", "latent", "text+audio"])
def test_valid_outputs(output):
    assert stage(0, output=output).output == output


def test_bad_output_modality_and_kind_together():
    msg = errors_of(lambda: StageSpec(id=0, name="x", kind="difusion", output="text+smell"))
    assert "unknown stage kind 'difusion'; did you mean 'diffusion'?" in msg
    assert "unknown modality 'smell'" in msg


def test_output_modality_twice_and_empty():
    assert "names a modality twice" in errors_of(lambda: stage(0, output="text+text"))
    assert "unknown modality ''" in errors_of(lambda: stage(0, output="text+"))


def test_stage_field_types():
    msg = errors_of(lambda: StageSpec(id=-1, name="", kind="ar", output="text", inputs=("a",), input_processor=3))
    assert "id must be a non-negative int" in msg
    assert "name must be a non-empty string" in msg
    assert "inputs must be a tuple of stage ids" in msg
    assert "input_processor must be callable" in msg


def test_stream_input_needs_exactly_one_input():
    msg = errors_of(lambda: stage(2, inputs=(0, 1), stream_input=True))
    assert "stream_input=True needs exactly one input stage, has 2" in msg


def test_stream_input_without_upstream_chunk_processor():
    msg = errors_of(lambda: three_stage({1: {"chunk_processor": None}}))
    assert "stage 2 (vocoder) has stream_input=True but its input 1 (talker) has no chunk_processor" in msg


def test_chunk_processor_without_streaming_downstream():
    msg = errors_of(lambda: three_stage({2: {"stream_input": False}}))
    assert "stage 1 (talker) has a chunk_processor but its downstream 2 (vocoder) has stream_input=False" in msg


def test_chunk_processor_without_downstream():
    msg = errors_of(lambda: pipeline(stage(0, final_output=True, chunk_processor=chunker)))
    assert "has a chunk_processor but no downstream stage" in msg


def test_defaults_and_hard_are_checked_against_deploy_fields():
    msg = errors_of(
        lambda: stage(0, defaults={"max_num_seq": 2, "dtype": "fp8"}, hard={"executor": 3, "max_num_seqs": 1})
    )
    assert "defaults: unknown key 'max_num_seq'; did you mean 'max_num_seqs'?" in msg
    assert "defaults: dtype: 'fp8' is not one of auto|float32|bfloat16|float16" in msg
    assert "hard: executor: expected string, got integer 3" in msg


def test_key_in_both_defaults_and_hard():
    msg = errors_of(lambda: stage(0, defaults={"max_num_seqs": 2}, hard={"max_num_seqs": 1}))
    assert "['max_num_seqs'] in both defaults and hard" in msg


def test_specs_are_hashable():
    spec = three_stage()
    assert hash(spec) == hash(three_stage())
    assert {spec.stages[0]: "handle"}[three_stage().stages[0]] == "handle"


def test_specs_pickle_and_copy_for_stage_processes():
    import copy
    import pickle

    s = stage(0, defaults={"max_num_seqs": 2}, final_output=True)
    for clone in (pickle.loads(pickle.dumps(s)), copy.deepcopy(s)):
        assert clone == s
        with pytest.raises(TypeError, match="read-only"):
            clone.defaults["max_num_seqs"] = 3
    assert dataclasses.asdict(s)["defaults"] == {"max_num_seqs": 2}
