"""`Omni` and `AsyncOmni` over fake engines: batches in order, params forms, deploy
overrides, streaming, abort, errors, health and shutdown."""

from __future__ import annotations

import asyncio
import sys

import pytest
from engine.fake_engines import FakeEngine, streamed_tts, text_to_image

from omnistage import AsyncOmni, DiffusionParams, Omni, OmniRequestError, SamplingParams


def engine(omni, stage_id: int) -> FakeEngine:
    orchestrator = omni.async_omni.orchestrator if isinstance(omni, Omni) else omni.orchestrator
    return orchestrator.handles[stage_id].endpoint.server.engine  # the supervisor's inline endpoint


@pytest.fixture
def omni():
    with Omni("m", pipeline=text_to_image(), engine_factory=FakeEngine) as omni:
        yield omni


def test_import_is_cheap():
    import subprocess

    code = "import sys, omnistage; omnistage.Omni; print(sorted({'torch', 'numpy', 'diffusers'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_generate_returns_outputs_in_input_order(omni):
    prompts = ["a", "bb", "ccc", "dddd"]
    outs = omni.generate(prompts, use_tqdm=False)
    assert [o.images[0].info["prompt"] for o in outs] == [f"expander({p})" for p in prompts]
    assert all(o.finished and o.text is None and o.audio is None and o.video is None for o in outs)
    assert all(o.metrics["stages"]["drawer"]["num_steps"] == 2 for o in outs)
    [single] = omni.generate({"prompt": "one"}, use_tqdm=False)
    assert single.images[0].info["prompt"] == "expander(one)"


def test_params_one_object_list_or_dict_by_stage_name(omni):
    diffusion, sampling = DiffusionParams(num_inference_steps=3), SamplingParams(max_tokens=5)
    cases = [
        (diffusion, {1: diffusion}),
        (sampling, {0: sampling}),
        ([sampling, diffusion], {0: sampling, 1: diffusion}),
        ([None, diffusion], {1: diffusion}),
        ({"drawer": diffusion}, {1: diffusion}),
    ]
    for params, expected in cases:
        out = omni.generate("x", params, use_tqdm=False)[0]
        got = {sid: engine(omni, sid).params[out.request_id] for sid in (0, 1)}
        assert got == {sid: expected.get(sid) for sid in (0, 1)}, params


@pytest.mark.parametrize("params, message", [
    ([DiffusionParams()], "got a list of 1, but pipeline 't2i' has 2 stages"),
    ({"painter": DiffusionParams()}, r"\['painter'\] are not stage names of pipeline 't2i'; stages: expander, drawer"),
    ({"expander": DiffusionParams()}, r"params for stage 0 \(expander\): expected SamplingParams, got DiffusionParams"),
    ("temperature=0", "str is for no stages"),
])
def test_bad_params_are_refused_before_anything_runs(omni, params, message):
    with pytest.raises(ValueError, match=message):
        omni.generate("x", params, use_tqdm=False)
    assert engine(omni, 0).added == []


def test_chat_messages_must_be_wrapped(omni):
    with pytest.raises(ValueError, match="one list of chat messages"):
        omni.generate([{"role": "user", "content": "hi"}], use_tqdm=False)


def test_a_failed_request_raises_after_the_batch_naming_the_stage(omni):
    with pytest.raises(OmniRequestError, match=r"request .* failed: stage 0 \(expander\): poisoned input") as info:
        omni.generate(["fine", "poison", "also fine"], use_tqdm=False)
    outs = info.value.outputs
    assert outs[0].images and outs[2].images and outs[1].error and outs[1].stage == "expander"


def test_overrides_reach_every_stage_of_the_kind_that_uses_them():
    with Omni("m", pipeline=text_to_image(), engine_factory=FakeEngine, stage_overrides={"0": {"max_num_seqs": 2}},
              max_num_seqs=8, cache_backend="tea_cache") as omni:
        expander, drawer = engine(omni, 0).config, engine(omni, 1).config
    assert (expander.max_num_seqs, expander.cache_backend) == (2, None)
    assert (drawer.max_num_seqs, drawer.cache_backend) == (8, "tea_cache")


def test_an_override_no_stage_uses_or_that_does_not_exist_is_an_error():
    with pytest.raises(ValueError, match=r"no stage that uses cache_backend \(diffusion stages\)"):
        Omni("m", pipeline=streamed_tts(), engine_factory=FakeEngine, cache_backend="tea_cache")
    with pytest.raises(ValueError, match="did you mean 'max_num_seqs'"):
        Omni("m", pipeline=text_to_image(), engine_factory=FakeEngine, max_num_seq=8)


async def _collect(stream):
    return [out async for out in stream]


def test_async_generate_streams_text_deltas_and_audio_chunks():
    async def main():
        async with AsyncOmni("m", pipeline=streamed_tts(), engine_factory=FakeEngine) as omni:
            assert await omni.check_health()
            outs = await _collect(omni.generate("hello", request_id="r1"))
            return outs

    outs = asyncio.run(main())
    assert all(o.request_id == "r1" for o in outs)
    assert [o.finished for o in outs] == [False] * (len(outs) - 1) + [True]
    final = outs[-1]
    assert "".join(o.text_delta for o in outs if o.text_delta) == final.text == "talker(hello)"
    assert sum(len(o.audio_chunk) for o in outs if o.audio_chunk is not None) == len(final.audio)


def test_modalities_run_only_the_stages_that_make_them():
    async def main():
        async with AsyncOmni("m", pipeline=streamed_tts(), engine_factory=FakeEngine) as omni:
            outs = await _collect(omni.generate("hello", modalities=["text"]))
            with pytest.raises(ValueError, match="pipeline 'tts' cannot make 'image'; it makes 'audio', 'text'"):
                await omni.generate("x", modalities=["image"]).__anext__()
            with pytest.raises(ValueError, match=r"modalities: give a list of modalities such as \['text'\]"):
                await omni.generate("x", modalities="text").__anext__()
            return outs, engine(omni, 1).added

    outs, vocoder_requests = asyncio.run(main())
    assert outs[-1].text == "talker(hello)" and outs[-1].audio is None and vocoder_requests == []
    with Omni("m", pipeline=streamed_tts(), engine_factory=FakeEngine) as omni:
        outs = omni.generate(["a", "b"], modalities=("text",), use_tqdm=False)
        assert [o.text for o in outs] == ["talker(a)", "talker(b)"] and engine(omni, 1).added == []
        with pytest.raises(ValueError, match="cannot make 'video'"):
            omni.generate(["a", "b"], modalities=["video"], use_tqdm=False)
        assert engine(omni, 0).added == [o.request_id for o in outs]  # nothing of the refused batch ran


def test_async_abort_and_leaving_the_loop_early_stop_the_request():
    import functools

    slow = functools.partial(FakeEngine, num_tokens=1000, step_delay=0.005)

    async def main():
        async with AsyncOmni("m", pipeline=streamed_tts(), engine_factory=slow) as omni:
            # 1. abort() from elsewhere: the stream ends with finish_reason "abort"
            stream = omni.generate("x", request_id="a")
            first = await stream.__anext__()
            await omni.abort("a")
            rest = await _collect(stream)
            # 2. the consumer walks away: the request is aborted in every stage
            async for out in omni.generate("y", request_id="b"):
                break
            await asyncio.sleep(0.2)
            return first, rest, omni

    first, rest, omni = asyncio.run(main())
    assert not first.finished and rest[-1].finished and rest[-1].finish_reason == "abort"
    assert "a" in engine(omni, 0).aborted and "b" in engine(omni, 0).aborted
    assert not engine(omni, 0).running and not engine(omni, 1).running


def test_async_errors_come_as_an_output_and_bad_params_raise_at_once():
    async def main():
        async with AsyncOmni("m", pipeline=text_to_image(), engine_factory=FakeEngine) as omni:
            failed, ok = await asyncio.gather(_collect(omni.generate("fail:drawer")), _collect(omni.generate("fine")))
            with pytest.raises(ValueError, match="are not stage names"):
                await omni.generate("x", {"nope": None}).__anext__()
            healthy = await omni.check_health()
        return failed, ok, healthy, await omni.check_health()

    failed, ok, healthy_before, healthy_after = asyncio.run(main())
    assert failed[-1].error == "stage 1 (drawer): the fake engine failed" and failed[-1].finish_reason == "error"
    assert ok[-1].error is None and ok[-1].images
    assert healthy_before and not healthy_after  # shut down by the context manager


def test_metrics_are_exported_to_the_given_registry():
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry()
    with Omni("m", pipeline=text_to_image(), engine_factory=FakeEngine, metrics_registry=registry) as omni:
        omni.generate(["a", "b"], use_tqdm=False)
        assert omni.async_omni.metrics_registry is registry
    assert 'omnistage_requests_total{pipeline="t2i",status="finished"} 2.0' in generate_latest(registry).decode()


def test_params_per_prompt_and_how_a_list_is_read(omni):
    prompts = ["a", "b", "c"]
    per_prompt = [DiffusionParams(seed=s) for s in (1, 2, 3)]
    outs = omni.generate(prompts, per_prompt, use_tqdm=False)
    assert [engine(omni, 1).params[o.request_id].seed for o in outs] == [1, 2, 3]
    assert all(engine(omni, 0).params[o.request_id] is None for o in outs)
    # Entries may be any per-request form: a dict by stage name, a per-stage list.
    outs = omni.generate(["a", "b"], [{"drawer": DiffusionParams(seed=5)}, [SamplingParams(max_tokens=2), None]],
                         use_tqdm=False)
    assert engine(omni, 1).params[outs[0].request_id].seed == 5
    assert engine(omni, 0).params[outs[1].request_id].max_tokens == 2
    # A per-stage list still works for any number of prompts but its own length ...
    sampling, diffusion = SamplingParams(max_tokens=4), DiffusionParams(seed=9)
    outs = omni.generate(["a", "b", "c"], [sampling, diffusion], use_tqdm=False)
    assert all(engine(omni, 1).params[o.request_id] == diffusion for o in outs)
    # ... and with as many prompts as stages, a list that fits both readings is refused.
    with pytest.raises(ValueError, match="per stage and per prompt"):
        omni.generate(["a", "b"], [sampling, diffusion], use_tqdm=False)
    outs = omni.generate(["a", "b"], {"expander": sampling, "drawer": diffusion}, use_tqdm=False)
    assert engine(omni, 1).params[outs[1].request_id] == diffusion
