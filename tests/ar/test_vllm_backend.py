"""`ar_backend: vllm` (VLLMAREngine) against the native AR engine on the zoo's tiny qwen2-llm.

The tests that run vLLM skip unless it is installed (`pip install 'omnistage[vllm]'`; on
CPU see the README recipe); they share one vLLM engine per module, since starting one
takes 25-50 s on CPU. The refusals at the end run everywhere.
"""

from __future__ import annotations

import sys

import pytest

from ar_helpers import PROMPTS, final, make_engine, run
from omnistage.ar.sampling_params import SamplingParams
from omnistage.config.deploy_fields import StageDeployConfig
from omnistage.config.spec import StageSpec
from omnistage.core.types import StageRequest
from omnistage.engine.factory import create_engine

LLM_STAGE = StageSpec(id=0, name="llm", kind="ar", output="text", final_output=True)
CONFIG = dict(devices=("cpu",), dtype="float32", max_num_seqs=2, max_model_len=256)
GREEDY = SamplingParams(max_tokens=16, temperature=0.0)


@pytest.fixture(scope="module")
def vllm_engine(llm_path):
    pytest.importorskip("vllm")
    engine = create_engine(llm_path, LLM_STAGE, StageDeployConfig(ar_backend="vllm", **CONFIG))
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def native_engine(llm_path):
    engine = make_engine(llm_path, **{k: v for k, v in CONFIG.items() if k not in ("devices", "dtype")})
    yield engine
    engine.close()


def greedy_requests() -> list[StageRequest]:
    chat = [{"role": "user", "content": "good morning"}]
    return [
        *(StageRequest(f"p{i}", prompt, GREEDY) for i, prompt in enumerate(PROMPTS)),
        StageRequest("chat", {"messages": chat}, GREEDY),
        StageRequest("ids", {"prompt_token_ids": [5, 17, 200, 31]}, GREEDY),
        StageRequest("stop-id", "a photo of a cat", SamplingParams(max_tokens=16, temperature=0, stop_token_ids=[621])),
        StageRequest("stop-str", "a photo of a cat", SamplingParams(max_tokens=16, temperature=0, stop=["cat cat"])),
        StageRequest("min", "Hello world!", SamplingParams(max_tokens=8, min_tokens=8, temperature=0,
                                                           repetition_penalty=1.3)),
    ]


# --- on vLLM ---------------------------------------------------------------------------------


def test_factory_picks_vllm(vllm_engine):
    from omnistage.ar.vllm_backend import VLLMAREngine

    assert isinstance(vllm_engine, VLLMAREngine)
    assert vllm_engine.max_model_len == 256 and vllm_engine.is_healthy()


def test_greedy_matches_native(vllm_engine, native_engine):
    ours = run(native_engine, greedy_requests())
    theirs = run(vllm_engine, greedy_requests())
    assert sorted(theirs) == sorted(ours)
    for rid in ours:
        want, got = final(ours, rid), final(theirs, rid)
        assert got.token_ids == want.token_ids, rid
        assert got.finish_reason == want.finish_reason, rid
        # Bytes that never form valid UTF-8 differ: the native detokenizer ends them as
        # replacement characters (as tokenizer.decode does); vLLM's drops them.
        if "\ufffd" not in want.text:
            assert got.text == want.text, rid
    assert final(theirs, "stop-id").finish_reason == "stop" and final(theirs, "stop-id").token_ids[-1] == 621
    assert final(theirs, "stop-str").finish_reason == "stop" and "cat cat" not in final(theirs, "stop-str").text
    assert len(final(theirs, "min").token_ids) == 8


def test_stream_deltas_add_up(vllm_engine):
    outs = run(vllm_engine, [StageRequest("s", PROMPTS[3], SamplingParams(max_tokens=40, temperature=0))])["s"]
    assert len(outs) > 1 and all(not o.finished for o in outs[:-1]) and outs[-1].finished
    last = outs[-1].payload
    assert "".join(o.payload.delta_text for o in outs) == last.text
    assert sum((o.payload.delta_token_ids for o in outs), []) == last.token_ids
    assert len(last.token_ids) == 40 and last.finish_reason == "length"
    metrics = outs[-1].metrics
    assert metrics["num_generated_tokens"] == 40 and metrics["time_to_first_token"] > 0
    assert metrics["num_prompt_tokens"] == len(vllm_engine.prompts.build_prompt(PROMPTS[3]).token_ids)


def test_abort(vllm_engine):
    long = SamplingParams(max_tokens=200, temperature=0, ignore_eos=True)

    def abort_after_three(step, engine):
        if step == 3:
            engine.abort_request("a")
            engine.abort_request("unknown")  # ignored

    outs = run(vllm_engine, [StageRequest("a", PROMPTS[0], long), StageRequest("b", PROMPTS[1], long)],
               on_step=abort_after_three)
    aborted, done = final(outs, "a"), final(outs, "b")
    assert aborted.finish_reason == "abort" and 0 < len(aborted.token_ids) < 200
    assert done.finish_reason == "length" and len(done.token_ids) == 200
    assert not vllm_engine.has_unfinished_requests()


def test_max_num_seqs(vllm_engine):
    """Four requests, max_num_seqs=2: no step advances more than two of them."""
    requests = [StageRequest(f"m{i}", prompt, SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))
                for i, prompt in enumerate(PROMPTS)]
    for r in requests:
        vllm_engine.add_request(r)
    most, finished = 0, set()
    while vllm_engine.has_unfinished_requests():
        outs = vllm_engine.step()
        most = max(most, sum(1 for o in outs if o.payload.delta_token_ids))
        finished |= {o.request_id for o in outs if o.finished}
    assert most == 2 and finished == {r.request_id for r in requests}


def test_refused_requests(vllm_engine):
    with pytest.raises(ValueError, match="max_model_len=256"):
        vllm_engine.add_request(StageRequest("long", {"prompt_token_ids": [5] * 250}, SamplingParams(max_tokens=16)))
    with pytest.raises(ValueError, match="ar_backend 'native'"):
        vllm_engine.add_request(StageRequest("hs", {"prompt": "hi", "return_hidden_states": True}, GREEDY))
    with pytest.raises(ValueError, match="unknown AR input key"):
        vllm_engine.add_request(StageRequest("bad", {"text": "hi"}, GREEDY))
    assert not vllm_engine.has_unfinished_requests()


class _Borrowed:
    """The module's engine, lent to an Omni that must not close it."""

    def __init__(self, engine):
        self.engine = engine

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def close(self):
        pass


def test_omni_end_to_end(vllm_engine, native_engine, llm_path):
    from omnistage import Omni

    seen = []

    def lend(model_path, stage, config):  # create_engine would start a second vLLM engine
        seen.append((stage.model, config.ar_backend))
        return _Borrowed(vllm_engine)

    with Omni(llm_path, ar_backend="vllm", engine_factory=lend) as omni:
        [out] = omni.generate("Hello world!", GREEDY, use_tqdm=False)
    assert seen == [(None, "vllm")]
    want = final(run(native_engine, [StageRequest("n", "Hello world!", GREEDY)]), "n")
    assert out.finished and out.error is None
    assert out.token_ids == want.token_ids and out.text == want.text and out.finish_reason == "length"


# --- everywhere --------------------------------------------------------------------------------


def test_without_vllm_the_error_says_how_to_install(llm_path, monkeypatch):
    from omnistage import Omni

    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` fails, installed or not
    with pytest.raises(ImportError, match=r"pip install 'omnistage\[vllm\]'.*torch==2.13.0.*uninstall -y torchvision"):
        Omni(llm_path, ar_backend="vllm")


def test_family_stages_stay_native(llm_path):
    thinker = StageSpec(id=0, name="thinker", kind="ar", output="text", final_output=True,
                        model="qwen2_5_omni.thinker")
    with pytest.raises(ValueError, match="family model 'qwen2_5_omni.thinker'.*only ar_backend 'native'"):
        create_engine(llm_path, thinker, StageDeployConfig(ar_backend="vllm"))
