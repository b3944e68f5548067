"""DiffusionEngine with the in-process executor, over a fake pipeline (no model)."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from fake_diffusion import FakePipeline, FakeRequestOnlyPipeline, make_fake_model
from omnistage.config.deploy_fields import StageDeployConfig
from omnistage.core.types import Engine, ImagePayload, ProgressPayload, StageRequest
from omnistage.diffusion.engine import DiffusionEngine
from omnistage.diffusion.params import DiffusionParams


def make_engine(tmp_path, pipeline_cls=FakePipeline, **config) -> DiffusionEngine:
    return DiffusionEngine(make_fake_model(tmp_path / "m"), config=StageDeployConfig(**config),
                           pipeline_cls=pipeline_cls)


def run(engine: DiffusionEngine, max_steps: int = 200) -> dict[str, list]:
    """Step until idle; request id -> its outputs in order."""
    outputs: dict[str, list] = {}
    for _ in range(max_steps):
        if not engine.has_unfinished_requests():
            return outputs
        for out in engine.step():
            outputs.setdefault(out.request_id, []).append(out)
    raise AssertionError("engine did not finish")


def pixels(output) -> np.ndarray:
    return np.stack([np.asarray(img) for img in output.payload.images])


def req(rid: str, prompt: str = "a cat", **params) -> StageRequest:
    return StageRequest(rid, prompt, DiffusionParams(seed=7, **params))


def test_request_mode_batches_give_the_same_images_as_alone(tmp_path):
    engine = make_engine(tmp_path, max_num_seqs=4)
    assert isinstance(engine, Engine)
    prompts = ["a cat", "a dog", "a boat"]
    alone = {}
    for i, prompt in enumerate(prompts):
        engine.add_request(req(f"alone{i}", prompt))
        alone[i] = pixels(run(engine)[f"alone{i}"][-1])
    for i, prompt in enumerate(prompts):
        engine.add_request(req(f"batch{i}", prompt))
    outs = run(engine)
    pipeline = engine.executor.worker.runner.pipeline
    assert pipeline.batch_sizes[-1] == 3
    for i in range(3):
        final = outs[f"batch{i}"][-1]
        assert final.finished and final.error is None and final.metrics["batch_size"] == 3
        np.testing.assert_array_equal(pixels(final), alone[i])
    engine.close()


def test_progress_per_step_then_final_with_metrics(tmp_path):
    engine = make_engine(tmp_path)
    engine.add_request(StageRequest("r", {"prompt": "x"}, DiffusionParams(num_inference_steps=4, seed=3)))
    outs = run(engine)["r"]
    assert [o.payload.step for o in outs[:-1]] == [1, 2, 3, 4]
    assert all(isinstance(o.payload, ProgressPayload) and not o.finished for o in outs[:-1])
    final = outs[-1]
    assert final.finished and isinstance(final.payload, ImagePayload)
    assert final.payload.images[0].size == (16, 16)
    m = final.metrics
    assert m["num_steps"] == 4 and m["batch_size"] == 1 and m["seed"] == 3
    assert m["queue_time"] >= 0 and m["run_time"] >= 0
    engine.close()


def test_unseeded_request_reports_a_seed_that_reproduces_it(tmp_path):
    engine = make_engine(tmp_path)
    engine.add_request(StageRequest("a", "x"))
    first = run(engine)["a"][-1]
    engine.add_request(StageRequest("b", "x", {"seed": first.metrics["seed"]}))
    np.testing.assert_array_equal(pixels(run(engine)["b"][-1]), pixels(first))
    engine.close()


@pytest.mark.parametrize("inputs, params, field", [
    (123, None, "inputs"),
    ({"prompt": "x", "mask": 1}, None, "mask"),
    ({"prompt": None}, None, "prompt"),
    ({"prompt": "x", "image": "not an image"}, None, "image"),
    ("x", {"height": 12}, "height"),
    ("x", {"num_inference_steps": 0}, "num_inference_steps"),
    ("x", {"extras": {"nope": 1}}, "nope"),
    ("x", {"extras": {"strength": 2.0}}, "strength"),
    ({"prompt": "x", "image": Image.new("RGB", (8, 8))}, None, "image"),
])
def test_bad_input_raises_naming_the_field_and_queues_nothing(tmp_path, inputs, params, field):
    engine = make_engine(tmp_path)
    with pytest.raises(ValueError, match=field):
        engine.add_request(StageRequest("r", inputs, params))
    assert not engine.has_unfinished_requests()
    engine.close()


def test_a_failing_batch_fails_its_requests_and_the_engine_serves_on(tmp_path):
    engine = make_engine(tmp_path, max_num_seqs=4)
    engine.add_request(req("bad", "fail-step now"))
    engine.add_request(req("ok1", "fine"))  # same batch as "bad": fails with it
    outs = run(engine)
    assert "fake denoise failure" in outs["bad"][-1].error and outs["ok1"][-1].error
    engine.add_request(req("ok2", "fine"))
    final = run(engine)["ok2"][-1]
    assert final.error is None and final.finished
    assert engine.is_healthy()
    engine.close()


def test_step_mode_staggered_joins_abort_and_parity_with_request_mode(tmp_path):
    ref = make_engine(tmp_path / "ref")
    expected = {}
    for rid, steps in [("a", 5), ("b", 2), ("c", 3)]:
        ref.add_request(req(rid, f"prompt {rid}", num_inference_steps=steps))
        expected[rid] = pixels(run(ref)[rid][-1])
    ref.close()

    engine = make_engine(tmp_path / "step", step_execution=True, max_num_seqs=4)
    outs: dict[str, list] = {}

    def tick():
        for out in engine.step():
            outs.setdefault(out.request_id, []).append(out)

    engine.add_request(req("a", "prompt a", num_inference_steps=5))
    engine.add_request(req("gone", "prompt gone", num_inference_steps=5))
    tick()
    engine.add_request(req("b", "prompt b", num_inference_steps=2))  # joins a running batch
    tick()
    engine.abort_request("gone")
    engine.add_request(req("c", "prompt c", num_inference_steps=3))
    tick()
    assert outs["b"][-1].finished  # 2 steps, joined one step late, left early
    while engine.has_unfinished_requests():
        tick()
    assert "gone" in outs and not any(o.finished for o in outs["gone"])
    assert len(outs["gone"]) == 2  # progress for the two steps before the abort, then nothing
    assert engine.executor.worker.runner.states == {}  # every state freed
    pipeline = engine.executor.worker.runner.pipeline
    assert pipeline.batch_sizes[:3] == [2, 3, 3]  # a+gone, then b joined, then c in for gone
    for rid in "abc":
        np.testing.assert_array_equal(pixels(outs[rid][-1]), expected[rid])
        assert [o.payload.step for o in outs[rid][:-1]] == list(range(1, len(outs[rid])))
    assert outs["a"][-1].metrics["batch_size"] > 1
    engine.close()


@pytest.mark.parametrize("step_execution", [False, True])
def test_partial_images_and_encode_failure(tmp_path, step_execution):
    engine = DiffusionEngine(make_fake_model(tmp_path),
                             config=StageDeployConfig(step_execution=step_execution, max_num_seqs=2),
                             pipeline_cls=FakePipeline)
    engine.add_request(req("p", "x", num_inference_steps=9, partial_images=2))
    engine.add_request(req("q", "x", num_inference_steps=9))
    engine.add_request(req("bad", "fail-encode"))
    outs = run(engine)
    assert "fake encode failure" in outs["bad"][-1].error
    previews = [o.payload.preview for o in outs["p"][:-1]]
    assert [i + 1 for i, p in enumerate(previews) if p is not None] == [3, 6]  # evenly spaced, never the last
    assert isinstance(previews[2], Image.Image)
    assert all(o.payload.preview is None for o in outs["q"][:-1])
    engine.close()


@pytest.mark.parametrize("step_execution", [False, True])
def test_one_at_a_time_pipeline_caps_batches(tmp_path, step_execution):
    engine = make_engine(tmp_path, pipeline_cls=FakeRequestOnlyPipeline, max_num_seqs=8, step_execution=step_execution)
    assert engine.scheduler.max_num_seqs == 1
    engine.close()


def test_config_errors_name_the_field(tmp_path):
    with pytest.raises(ValueError, match="executor"):
        make_engine(tmp_path, executor="threads")
    with pytest.raises(ValueError, match="uni"):
        make_engine(tmp_path, num_devices=2)
    with pytest.raises(ValueError, match="dtype"):
        make_engine(tmp_path, dtype="float8")
    with pytest.raises(ValueError, match="default_sampling_params"):
        make_engine(tmp_path, default_sampling_params={"steps": 3})


def test_default_params_from_config_and_show_progress(tmp_path, capsys):
    engine = DiffusionEngine(make_fake_model(tmp_path),
                             config=StageDeployConfig(default_sampling_params={"num_inference_steps": 2}),
                             pipeline_cls=FakePipeline, show_progress=True)
    engine.add_request(StageRequest("r", "x"))
    assert run(engine)["r"][-1].metrics["num_steps"] == 2
    assert "denoising" in capsys.readouterr().err
    engine.close()
    engine.close()
    assert not engine.is_healthy()
    with pytest.raises(RuntimeError, match="unhealthy"):
        engine.add_request(StageRequest("s", "x"))


def test_model_index_picks_the_pipeline_class(tmp_path):
    from omnistage.diffusion.checkpoint import CheckpointConfigs

    assert CheckpointConfigs.read(make_fake_model(tmp_path)).class_name == "FakePipeline"


class CountingPipeline(FakePipeline):
    """Counts `prepare_request` over every instance: the engine's checker and the worker's pipeline."""

    num_prepared: list[str] = []

    def prepare_request(self, request):
        CountingPipeline.num_prepared.append(request.request_id)
        return super().prepare_request(request)


def test_a_request_is_prepared_once_and_its_id_checked_once(tmp_path):
    """The engine prepares a request before queueing it; the worker's `encode` takes it as is."""
    CountingPipeline.num_prepared = []
    engine = make_engine(tmp_path, CountingPipeline, default_sampling_params={"num_inference_steps": 2})
    engine.add_request(StageRequest("r", "a cat"))
    final = run(engine)["r"][-1]
    assert final.error is None and final.metrics["num_steps"] == 2  # the filled defaults reached the worker
    assert CountingPipeline.num_prepared == ["r"]
    engine.add_request(StageRequest("s", "a cat"))
    with pytest.raises(ValueError, match="request_id: 's' is already running") as refused:
        engine.add_request(StageRequest("s", "a dog"))
    assert refused.value.param == "request_id"
    run(engine)
    engine.close()
