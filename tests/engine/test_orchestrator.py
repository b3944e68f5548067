"""Orchestrator routing over fake engines: whole and streamed hand-off, fan-in, several
final stages, abort, stage errors, metrics. Inline stages, driven by `step()`."""

from __future__ import annotations

import time

import numpy as np
import pytest
from fake_engines import FakeEngine, every_token, expand_to_image, streamed_tts, text_to_image

from omnistage.config import PipelineSpec, StageDeployConfig, StageSpec
from omnistage.core.errors import ErrorKind
from omnistage.engine.orchestrator import OmniRequest, Orchestrator


def make(spec: PipelineSpec, **engine_kwargs) -> Orchestrator:
    return Orchestrator(spec, "fake-model", engine_factory=lambda m, s, c: FakeEngine(m, s, c, **engine_kwargs))


def run(orch: Orchestrator, *requests: OmniRequest, max_steps: int = 200) -> dict[str, list]:
    """Submit, step until idle; every output by request id."""
    for request in requests:
        orch.submit(request)
    outputs: dict[str, list] = {r.request_id: [] for r in requests}
    for _ in range(max_steps):
        for out in orch.step():
            outputs[out.request_id].append(out)
        if not orch.has_unfinished_requests():
            return outputs
    raise AssertionError("requests did not finish")


def engine(orch: Orchestrator, stage_id: int) -> FakeEngine:
    return orch.handles[stage_id].endpoint.server.engine  # the supervisor's inline endpoint


def test_whole_handoff_text_becomes_image_prompt():
    orch = make(text_to_image())
    outs = run(orch, OmniRequest("r1", "a cat"))["r1"]
    final = outs[-1]
    assert final.finished and final.error is None and final.finish_reason == "stop"
    assert [o.finished for o in outs[:-1]] == [False] * (len(outs) - 1)
    assert final.images[0].info["prompt"] == "expander(a cat)"
    assert final.text is None and final.audio is None and final.video is None
    # progress of the diffusion stage streams to the user, text of the non-final stage does not
    assert [(o.stage, o.progress.step) for o in outs[:-1]] == [("drawer", 1), ("drawer", 2)]
    stages = final.metrics["stages"]
    assert stages["expander"]["num_tokens"] == 4 and stages["drawer"]["num_steps"] == 2
    assert stages["expander"]["finish_time"] <= stages["drawer"]["start_time"]
    orch.close()


def test_entry_stage_gets_the_prompt_as_given_and_params_per_stage():
    orch = make(text_to_image())
    prompt = {"prompt": "dog", "extra": 1}
    run(orch, OmniRequest("r1", prompt, params={1: "drawer-params"}))
    assert engine(orch, 0).added == ["r1"] and engine(orch, 1).added == ["r1"]
    orch.close()


def test_fan_in_waits_for_every_input():
    def join(request, upstream):
        return {"prompt": f"{upstream[0].text} & {upstream[1].text}"}

    spec = PipelineSpec("fan", (
        StageSpec(0, "left", "ar", "text"),
        StageSpec(1, "right", "ar", "text"),
        StageSpec(2, "joiner", "ar", "text", inputs=(0, 1), final_output=True, input_processor=join),
    ))
    orch = make(spec)
    final = run(orch, OmniRequest("r", "x"))["r"][-1]
    assert final.text == "joiner(left(x) & right(x))"
    orch.close()


def test_default_input_without_processor_is_the_upstream_payload_or_dict():
    spec = PipelineSpec("fan", (
        StageSpec(0, "a", "ar", "text"),
        StageSpec(1, "b", "ar", "text"),
        StageSpec(2, "c", "ar", "text", inputs=(0, 1), final_output=True),
    ))
    orch = make(spec)
    assert run(orch, OmniRequest("r", "x"))["r"][-1].text == "c(a(x)+b(x))"
    orch.close()


def test_text_and_audio_from_two_final_stages_streamed_in_order():
    orch = make(streamed_tts())
    outs = run(orch, OmniRequest("r", "hello world"))["r"]
    final = outs[-1]
    assert final.finished and final.text == "talker(hello world)"
    # the vocoder ran once per chunk; its whole waveform joins the chunks in order
    pieces = [o.text_delta for o in outs if o.stage == "talker" and o.text_delta]
    assert "".join(pieces) == final.text
    chunks = [o.audio_chunk for o in outs if o.audio_chunk is not None]
    assert len(chunks) == 4 and sum(len(c) for c in chunks) == len(final.audio) == 10 * len(final.text)
    assert final.sample_rate == 16000 and final.audio.dtype.name == "float32"
    assert engine(orch, 1).added == ["r#0", "r#1", "r#2", "r#3"]
    orch.close()


def test_audio_metrics_count_the_stalls_of_a_player_that_plays_the_stream_in_real_time():
    # Each of the 4 chunks holds 10 samples per character at 16 kHz (a few ms of audio) and every
    # engine step takes 20 ms: a real-time player runs dry before each chunk after the first.
    from prometheus_client import generate_latest

    orch = make(streamed_tts(), step_delay=0.02)
    final = run(orch, OmniRequest("r", "hello world"))["r"][-1]
    samples = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
               for line in generate_latest(orch.metrics_registry).decode().splitlines() if not line.startswith("#")}
    assert samples['omnistage_audio_seconds_total{pipeline="tts"}'] == pytest.approx(len(final.audio) / 16000)
    assert samples['omnistage_audio_underruns_total{pipeline="tts"}'] == 3
    assert samples['omnistage_audio_underrun_seconds_count{pipeline="tts"}'] == 3
    assert samples['omnistage_audio_underrun_seconds_sum{pipeline="tts"}'] > 3 * 0.015
    assert orch.audio_streams() == {"ahead": 0, "behind": 0}  # none streams any more
    # Mid-stream: after its first few ms of audio the request's player is behind.
    orch.submit(OmniRequest("r2", "hello world"))
    while not any(out.audio_chunk is not None for out in orch.step()):
        pass
    time.sleep(0.01)
    assert orch.audio_streams() == {"ahead": 0, "behind": 1}
    orch.close()


def test_streamed_downstream_starts_before_upstream_ends():
    orch = make(streamed_tts(), num_tokens=6)
    final = run(orch, OmniRequest("r", "stream me"))["r"][-1]
    talker, vocoder = final.metrics["stages"]["talker"], final.metrics["stages"]["vocoder"]
    assert vocoder["start_time"] < talker["finish_time"]
    assert vocoder["first_output_time"] < talker["finish_time"]
    orch.close()


def test_downstream_stages_step_first_so_a_chunk_waits_for_no_upstream_step():
    """Inline stages share one thread: a chunk the talker made is voiced, and its audio delivered,
    before the talker's next step (first audio pays for one talker step, not two)."""
    log: list[str] = []

    class Logged(FakeEngine):
        def step(self):
            if self.running:
                log.append(self.stage.name)
            return super().step()

    orch = Orchestrator(streamed_tts(), "fake-model", engine_factory=lambda m, s, c: Logged(m, s, c))
    outs = run(orch, OmniRequest("r", "hello world"))["r"]
    assert log[:3] == ["talker", "vocoder", "talker"]
    assert log.count("vocoder") == 4
    # each text piece's audio leaves before the next piece (upstream-first stepping sent the second
    # piece of text first: text, text, audio, ...)
    kinds = [("text" if o.text_delta else "audio") for o in outs if o.text_delta or o.audio_chunk is not None]
    assert kinds == ["text", "audio"] * 4
    orch.close()


def test_streamed_parts_finishing_out_of_order_are_reordered():
    class Reversed(FakeEngine):
        """Holds audio requests and answers them in reverse order once it has three."""

        def step(self):
            if self.stage.output != "audio":
                return super().step()
            if len(self.running) < 3:
                return []
            outs = super().step()
            return outs[::-1]

    spec = PipelineSpec("tts", (
        StageSpec(0, "talker", "ar", "text", chunk_processor=every_token),
        StageSpec(1, "vocoder", "generation", "audio", inputs=(0,), final_output=True, stream_input=True),
    ))
    orch = Orchestrator(spec, "m", engine_factory=lambda m, s, c: Reversed(m, s, c, num_tokens=3))
    outs = run(orch, OmniRequest("r", "abcdefghi"))["r"]
    chunks = [o.audio_chunk for o in outs if o.audio_chunk is not None]
    # part sizes follow the text pieces in order, whatever order the engine answered in
    target = "talker(abcdefghi)"
    expected = [10 * (len(target) * (i + 1) // 3 - len(target) * i // 3) for i in range(3)]
    assert [len(c) for c in chunks] == expected
    orch.close()


def test_abort_mid_request_stops_every_stage():
    orch = make(streamed_tts(), num_tokens=12)
    orch.submit(OmniRequest("r", "long"))  # "talker(long)", one character a step
    outs = []
    for _ in range(5):
        outs += orch.step()
    assert engine(orch, 0).running and orch.has_unfinished_requests()
    orch.abort("r")
    outs += orch.step()
    assert outs[-1].finished and outs[-1].finish_reason == "abort"
    assert outs[-1].text == "talke"  # the text so far
    # the fifth chunk was still queued for dispatch when the abort came: it never reached the engine
    assert engine(orch, 1).added == [f"r#{i}" for i in range(4)] and not engine(orch, 1).running
    assert engine(orch, 0).aborted == ["r"] and not engine(orch, 0).running
    assert not orch.has_unfinished_requests() and not orch._engine_ids
    assert orch.step() == []  # nothing arrives for it afterwards
    orch.close()


def omni_like() -> PipelineSpec:
    """thinker (text, final) -> talker (text) -> vocoder (audio, final), as Qwen2.5-Omni."""
    return PipelineSpec("omni", (
        StageSpec(0, "thinker", "ar", "text", final_output=True),
        StageSpec(1, "talker", "ar", "text", inputs=(0,), chunk_processor=every_token),
        StageSpec(2, "vocoder", "generation", "audio", inputs=(1,), final_output=True, stream_input=True),
    ))


def test_text_only_request_skips_the_stages_that_make_audio():
    from prometheus_client import generate_latest

    orch = make(omni_like())
    assert [s.name for s in orch.needed_stages(OmniRequest("r", "x", output_modalities=("text",)))] == ["thinker"]
    outs = run(orch, OmniRequest("text", "hi", output_modalities=("text",)), OmniRequest("both", "hi"))
    text, both = outs["text"][-1], outs["both"][-1]
    assert text.finished and text.error is None and text.finish_reason == "stop"
    assert text.text == "thinker(hi)" and text.audio is None and text.stage == "thinker"
    assert not any(o.audio_chunk is not None for o in outs["text"])
    assert set(text.metrics["stages"]) == {"thinker"}
    # the skipped stages never saw it; the request asking for everything ran all three
    assert engine(orch, 0).added == ["text", "both"]
    assert engine(orch, 1).added == ["both"]
    assert all(rid.startswith("both") for rid in engine(orch, 2).added)
    assert set(both.metrics["stages"]) == {"thinker", "talker", "vocoder"} and both.audio is not None
    metrics = generate_latest(orch.metrics_registry).decode()
    assert 'omnistage_stage_tokens_total{pipeline="omni",stage="thinker"} 8.0' in metrics  # 4 each
    assert 'omnistage_stage_tokens_total{pipeline="omni",stage="talker"} 4.0' in metrics  # "both" only
    orch.close()


def test_audio_only_request_runs_the_stages_feeding_the_vocoder():
    orch = make(omni_like())
    final = run(orch, OmniRequest("r", "hi", output_modalities=("audio",)))["r"][-1]
    assert final.error is None and final.audio is not None
    # the thinker feeds the vocoder, so it runs, and the request waits for it as for any final stage it runs
    assert final.text == "thinker(hi)" and set(final.metrics["stages"]) == {"thinker", "talker", "vocoder"}
    orch.close()


def test_needed_stages_walk_back_from_the_wanted_final_stages():
    spec = PipelineSpec("fork", (
        StageSpec(0, "left", "ar", "text"),
        StageSpec(1, "right", "ar", "text"),
        StageSpec(2, "joiner", "ar", "text", inputs=(0, 1), final_output=True),
        StageSpec(3, "drawer", "diffusion", "image", inputs=(0,), final_output=True, input_processor=expand_to_image),
    ))
    orch = make(spec)

    def names(wanted):
        return [s.name for s in orch.needed_stages(OmniRequest("r", "x", output_modalities=wanted))]

    assert names(("text",)) == ["left", "right", "joiner"]
    assert names(("image",)) == ["left", "drawer"]
    assert names(("image", "text")) == names(None) == ["left", "right", "joiner", "drawer"]
    outs = run(orch, OmniRequest("img", "cat", output_modalities=("image",)))["img"]
    assert outs[-1].images[0].info["prompt"] == "left(cat)" and outs[-1].text is None
    assert engine(orch, 1).added == [] and engine(orch, 2).added == []
    orch.close()


@pytest.mark.parametrize("wanted, problem", [
    (("video",), "cannot make 'video'"),
    (("text", "latent"), "cannot make 'latent'"),
    ((), "got no modality"),
])
def test_a_modality_the_pipeline_cannot_make_is_refused_before_queueing(wanted, problem):
    orch = make(omni_like())
    with pytest.raises(ValueError, match=rf"output_modalities: pipeline 'omni' {problem}; it makes 'audio', 'text'"):
        orch.submit(OmniRequest("r", "x", output_modalities=wanted))
    assert orch.step() == [] and not orch.has_unfinished_requests() and engine(orch, 0).added == []
    orch.close()


def test_failing_input_processor_fails_only_its_request():
    def picky(request, upstream):
        if "bad" in request.prompt:
            raise ValueError("no bad prompts")
        return expand_to_image(request, upstream)

    spec = PipelineSpec("t2i", (
        StageSpec(0, "expander", "ar", "text"),
        StageSpec(1, "drawer", "diffusion", "image", inputs=(0,), final_output=True, input_processor=picky),
    ))
    orch = make(spec)
    outs = run(orch, OmniRequest("bad", "bad one"), OmniRequest("good", "good one"))
    bad, good = outs["bad"][-1], outs["good"][-1]
    assert bad.finished and bad.finish_reason == "error" and bad.stage == "drawer"
    assert bad.error.startswith("stage 1 (drawer): input_processor raised ValueError: no bad prompts")
    assert good.error is None and good.images[0].info["prompt"] == "expander(good one)"
    orch.close()


@pytest.mark.parametrize("trigger, message, kind", [
    ("poison", "poisoned input", ErrorKind.INVALID_REQUEST),  # the engine refused it: the caller's mistake
    ("fail", "the fake engine failed", None),
])
def test_engine_error_names_the_stage_and_spares_other_requests(trigger, message, kind):
    orch = make(text_to_image())
    outs = run(orch, OmniRequest("bad", f"{trigger} me"), OmniRequest("good", "fine"))
    bad = outs["bad"][-1]
    assert bad.error.startswith("stage 0 (expander): ") and message in bad.error and bad.error_kind == kind
    assert outs["good"][-1].error is None and outs["good"][-1].images
    orch.close()


def test_engine_step_raising_fails_the_requests_it_held_and_the_stage_goes_on():
    orch = make(text_to_image())
    outs = run(orch, OmniRequest("a", "explode"), OmniRequest("b", "too"))
    assert "engine step raised RuntimeError: the engine exploded" in outs["a"][-1].error
    assert outs["b"][-1].error is not None  # it shared the failed step
    after = run(orch, OmniRequest("c", "later"))["c"][-1]
    assert after.error is None and after.images
    assert orch.check_health()
    orch.close()


def test_duplicate_request_id_is_refused():
    got = []
    orch = make(text_to_image(), num_tokens=20)
    orch.submit(OmniRequest("r", "x"))
    orch.submit(OmniRequest("r", "y"), sink=got.append)
    orch.step()
    assert got and got[0].finished and "already running" in got[0].error
    orch.close()


def test_prometheus_metrics_go_to_each_orchestrators_own_registry():
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry()
    first = Orchestrator(text_to_image(), "m", engine_factory=FakeEngine, metrics_registry=registry)
    second = make(text_to_image())  # its own registry: no duplicate-timeseries clash
    run(first, OmniRequest("r", "x"), OmniRequest("bad", "poison"))
    text = generate_latest(registry).decode()
    assert 'omnistage_requests_total{pipeline="t2i",status="finished"} 1.0' in text
    assert 'omnistage_requests_total{pipeline="t2i",status="error"} 1.0' in text
    assert 'omnistage_stage_errors_total{pipeline="t2i",stage="expander"} 1.0' in text
    assert 'omnistage_stage_tokens_total{pipeline="t2i",stage="expander"} 4.0' in text
    assert 'omnistage_stage_time_to_first_output_seconds_count{pipeline="t2i",stage="drawer"} 1.0' in text
    assert 'status="finished"' not in generate_latest(second.metrics_registry).decode()
    first.close()
    second.close()


def test_close_ends_open_requests():
    got = []
    orch = make(text_to_image(), num_tokens=100)
    orch.submit(OmniRequest("r", "x"), sink=got.append)
    orch.step()
    orch.close()
    assert got[-1].finished and "closed" in got[-1].error
    assert engine(orch, 0).closed


def test_background_loop_delivers_to_sinks():
    import threading

    done = threading.Event()
    got = []

    def sink(out):
        got.append(out)
        if out.finished:
            done.set()

    orch = make(text_to_image())
    orch.start()
    orch.submit(OmniRequest("r", "x"), sink=sink)
    assert done.wait(10)
    assert got[-1].images and orch.check_health()
    orch.close()
    assert not orch.check_health()


@pytest.mark.parametrize("upstream_chunks, downstream_streams, problem", [
    (True, False, "has a chunk_processor but its downstream 1 (b) has stream_input=False"),
    (False, True, "has stream_input=True but its input 0 (a) has no chunk_processor"),
])
def test_both_ends_of_an_edge_must_agree_on_streaming(upstream_chunks, downstream_streams, problem):
    with pytest.raises(ValueError, match="streamed|stream_input") as info:
        PipelineSpec("p", (
            StageSpec(0, "a", "ar", "text", chunk_processor=every_token if upstream_chunks else None),
            StageSpec(1, "b", "generation", "audio", inputs=(0,), final_output=True, stream_input=downstream_streams),
        ))
    assert problem in str(info.value)


def test_stage_configs_reach_the_engines():
    orch = Orchestrator(text_to_image(), "m", {1: StageDeployConfig(max_num_seqs=3)}, engine_factory=FakeEngine)
    assert engine(orch, 1).config.max_num_seqs == 3 and engine(orch, 0).config.max_num_seqs == 1
    orch.close()


def test_a_pipeline_folder_names_each_stages_checkpoint(tmp_path):
    import json

    from omnistage.engine.factory import stage_model_paths

    (tmp_path / "llm").mkdir()
    (tmp_path / "config.json").write_text(json.dumps(
        {"model_type": "t2i", "stage_models": {"expander": "llm", "drawer": "org/some-hub-model"}}))
    assert stage_model_paths(str(tmp_path), text_to_image()) == {0: str(tmp_path / "llm"), 1: "org/some-hub-model"}
    orch = make(text_to_image())  # a plain checkpoint: every stage loads it
    assert engine(orch, 0).model_path == engine(orch, 1).model_path == "fake-model"
    orch.close()
    (tmp_path / "config.json").write_text(json.dumps({"stage_models": {"painter": "x"}}))
    with pytest.raises(ValueError, match=r"stage_models names \['painter'\], which are not stages of pipeline 't2i'"):
        stage_model_paths(str(tmp_path), text_to_image())


def test_a_request_queued_for_the_real_time_budget_starts_in_the_step_that_ends_the_stream_before_it():
    # The vocoder's fixed capacity fits one stream: the second request waits in the queue. When the
    # first ends, the second must be started in that same step, not after the loop's idle sleep.
    configs = {0: StageDeployConfig(), 1: StageDeployConfig(real_time_admission=True, audio_capacity=1.5)}
    orch = Orchestrator(streamed_tts(), "fake-model", configs,
                        engine_factory=lambda m, s, c: FakeEngine(m, s, c))
    orch.submit(OmniRequest("first", "hello"))
    orch.step()
    orch.submit(OmniRequest("second", "hello"))
    finished_first = False
    for _ in range(200):
        outs = orch.step()
        if any(o.request_id == "first" and o.finished for o in outs):
            finished_first = True
            break
        assert orch.has_unfinished_requests() and "second" not in orch._requests  # waits while first streams
    assert finished_first
    assert not orch._queued and "second" in orch._requests
    orch.close()


def test_a_pipeline_faster_than_real_time_admits_a_second_stream_before_its_rate_is_measured():
    # Each vocoder chunk is 1 s of audio made at once: the first stream leads its listener long
    # before the meter's shortest span has passed, so the second starts beside it, not after it.
    class SecondPerChunk(FakeEngine):
        def _output(self, rid, state):
            out = super()._output(rid, state)
            if self.stage.output == "audio":
                out.payload.audio = np.full(16000, 0.5, np.float32)
            return out

    configs = {0: StageDeployConfig(), 1: StageDeployConfig(real_time_admission=True)}
    orch = Orchestrator(streamed_tts(), "fake-model", configs,
                        engine_factory=lambda m, s, c: SecondPerChunk(m, s, c))
    orch.submit(OmniRequest("first", "hello"))
    for _ in range(200):
        orch.step()
        if orch._requests["first"].playback is not None:
            break
    orch.submit(OmniRequest("second", "hello"))
    orch.step()
    assert orch._admission.meter.rate is None  # admitted on the first stream's lead alone
    assert "first" in orch._requests and "second" in orch._requests and not orch._queued
    orch.close()
