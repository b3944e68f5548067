"""`compile: true`'s static-shape decode path (ar/cuda_graphs.py) on CPU: padded batch, bucketed
key length, buffers filled in place, run eagerly and "replayed" from stand-in graphs recorded
eagerly (a replay sees only what was filled in place; the KV pools never move), gathering the KV
blocks or reading them in place through the kernel (paged_attention.py). Greedy tokens
equal the eager engine's alone, in a ragged batch, joining mid-decode, after the batch
shrinks and across a key-length bucket; what capture records reads nothing back on the host;
`compile: true` is refused on CPU and for families that cannot be captured. (Real CUDA graphs:
tests/gpu/test_ar_cuda_graphs.py.)"""

from __future__ import annotations

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from omnistage.ar.cuda_graphs import StaticDecode, batch_sizes, kv_lens
from omnistage.ar.engine import check_cuda_graphs
from omnistage.ar.model import get_ar_model_class
from omnistage.ar.sampling_params import SamplingParams
from omnistage.config.deploy_fields import StageDeployConfig
from omnistage.config.spec import StageSpec
from omnistage.core.types import StageRequest
from omnistage.engine.factory import create_engine
from ar_helpers import PROMPTS, final, make_engine, run

MAX_NEW = 16
LLM = StageSpec(id=0, name="llm", kind="ar", output="text", final_output=True)


def greedy(n: int = MAX_NEW) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def eager(llm_path):
    eng = make_engine(llm_path, max_num_seqs=4)
    yield eng
    eng.close()


SYNC_OPS = {"_local_scalar_dense", "is_nonzero", "equal", "nonzero", "masked_select", "_unique2", "unique_dim",
            "unique_consecutive", "lift_fresh", "lift_fresh_copy"}
SYNC_CALLS = {"item", "tolist", "cpu", "numpy", "tensor", "__bool__", "__int__", "__float__", "__index__"}
"""What a CUDA graph capture cannot hold: reading a value back on the host (item, bool, int,
tolist, a data-dependent shape such as nonzero's) or a tensor made from Python data (an
upload). Caught on CPU at the torch function and the aten level."""


class HostSyncs(TorchFunctionMode):
    """`with HostSyncs() as seen:` lists the host syncs of the code inside (see SYNC_CALLS)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []
        self._ops = _SyncOps(self.seen)

    def __enter__(self):
        super().__enter__()
        self._ops.__enter__()
        return self.seen

    def __exit__(self, *exc):
        self._ops.__exit__(*exc)
        return super().__exit__(*exc)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in SYNC_CALLS:
            self.seen.append(func.__name__)
        return func(*args, **(kwargs or {}))


class _SyncOps(TorchDispatchMode):
    def __init__(self, seen: list[str]) -> None:
        super().__init__()
        self.seen = seen

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ in SYNC_OPS:
            self.seen.append(f"aten.{func.overloadpacket.__name__}")
        return func(*args, **(kwargs or {}))


class EagerRecorder:
    """A stand-in for `CudaGraphRecorder` on CPU: "capture" runs the forward once (listing its
    host syncs) and keeps its output; "replay" reruns the same closure (the same input tensors,
    the shape's views of the static buffers) and copies the result into that output, as a
    graph replay overwrites its outputs. So a replay sees only what was filled into the buffers
    in place."""

    def __init__(self) -> None:
        self.num_recorded = 0
        self.host_syncs: list[str] = []

    def __call__(self, forward):
        with HostSyncs() as seen:
            output = forward()
        self.host_syncs += seen
        self.num_recorded += 1

        def replay() -> None:
            output.logits.copy_(forward().logits)

        return replay, output


def pool_addresses(engine) -> list[int]:
    return [layer.keys.data_ptr() for layer in engine.runner.cache.layers]


@pytest.fixture(scope="module", params=["static", "replayed", "replayed in place"])
def static(llm_path, request):
    """The static path run eagerly, and "replayed" from eagerly recorded stand-in graphs, gathering
    the KV blocks or ("in place") reading them through a `PagedLayout` of static buffers."""
    in_place = request.param.endswith("in place")
    eng = make_engine(llm_path, max_num_seqs=4, paged_attention="kernel" if in_place else "gather")
    eng.runner.enable_static_decode(4, capture=False)
    assert eng.runner.static_decode.in_place == in_place
    if request.param != "static":
        recorder = EagerRecorder()
        eng.runner.static_decode.capture(recorder)
        assert recorder.num_recorded == len(eng.runner.static_decode.graphs) == 3 * 4  # (1, 2, 4) x 256..2048
        pools = pool_addresses(eng)
    yield eng
    if request.param != "static":
        assert pool_addresses(eng) == pools  # the KV pools were allocated whole before capture, never regrown
        assert eng.runner.static_decode.num_replays == sum(eng.runner.static_decode.steps_by_shape.values())
    eng.close()


def tokens(engine, requests, on_step=None) -> dict[str, list[int]]:
    outputs = run(engine, requests, on_step=on_step)
    return {rid: final(outputs, rid).token_ids for rid in outputs}


def static_tokens(engine, requests, on_step=None) -> tuple[dict[str, list[int]], dict[tuple[int, int], int]]:
    """The tokens, and the static decode steps the run took by (padded batch size, key length)."""
    before = dict(engine.runner.static_decode.steps_by_shape)
    got = tokens(engine, requests, on_step)
    after = engine.runner.static_decode.steps_by_shape
    return got, {shape: n - before.get(shape, 0) for shape, n in after.items() if n > before.get(shape, 0)}


def test_buckets():
    assert batch_sizes(1) == (1,) and batch_sizes(8) == (1, 2, 4, 8) and batch_sizes(6) == (1, 2, 4, 6)
    assert kv_lens(2048, 16) == (256, 512, 1024, 2048)
    assert kv_lens(100, 16) == (112,)  # whole blocks
    assert kv_lens(300, 16) == (256, 304)


def test_alone(eager, static):
    for i, p in enumerate(PROMPTS):
        requests = [StageRequest(f"a{i}", p, greedy())]
        got, shapes = static_tokens(static, requests)
        assert got == tokens(eager, requests), p
        assert shapes == {(1, 256): MAX_NEW - 1}  # every decode step ran static (the first token is the prefill's)


def test_ragged_batch_of_three_pads_to_four(eager, static):
    """Tokens equal, and so are the logprobs of every token (the padding row and the padded keys
    change nothing for the real rows but float summation order)."""
    params = SamplingParams(max_tokens=MAX_NEW, temperature=0.0, ignore_eos=True, logprobs=1)
    requests = [StageRequest(f"b{i}", p, params) for i, p in enumerate(PROMPTS[1:])]
    before = dict(static.runner.static_decode.steps_by_shape)
    got, want = run(static, requests), run(eager, requests)
    assert static.runner.static_decode.steps_by_shape[4, 256] - before.get((4, 256), 0) == MAX_NEW - 1
    for r in requests:
        ours, theirs = final(got, r.request_id), final(want, r.request_id)
        assert ours.token_ids == theirs.token_ids
        assert [lp.logprob for lp in ours.logprobs] == pytest.approx([lp.logprob for lp in theirs.logprobs], abs=1e-5)


def test_one_joins_mid_decode(eager, static):
    def join(step, eng):
        if step == 5:
            eng.add_request(StageRequest("late", PROMPTS[3], greedy()))

    requests = [StageRequest(f"j{i}", p, greedy()) for i, p in enumerate(PROMPTS[:2])]
    got, shapes = static_tokens(static, requests, on_step=join)
    assert got == tokens(eager, requests, on_step=join) and len(got) == 3
    assert shapes.get((2, 256)) and shapes.get((4, 256))  # two rows, then three padded to four


def test_batch_shrinks_as_rows_finish(eager, static):
    requests = [StageRequest(f"s{i}", p, greedy(n)) for i, (p, n) in enumerate(zip(PROMPTS[1:], (4, 9, 16)))]
    got, shapes = static_tokens(static, requests)
    assert got == tokens(eager, requests) and [len(got[f"s{i}"]) for i in range(3)] == [4, 9, 16]
    assert shapes == {(4, 256): 3, (2, 256): 5, (1, 256): 7}


def test_context_crossing_a_key_length_bucket(eager, static):
    prompt = {"prompt_token_ids": [(37 * i) % 1000 + 3 for i in range(250)]}
    requests = [StageRequest("long", prompt, greedy()), StageRequest("short", PROMPTS[0], greedy())]
    got, shapes = static_tokens(static, requests)
    assert got == tokens(eager, requests)
    assert set(shapes) == {(2, 256), (2, 512)}  # the long row's context passes 256 mid-way


def test_steps_above_max_graph_keys_stay_eager(eager, llm_path):
    """With room for 2 x 256 keys only, the two rows past 256 tokens of context run eagerly."""
    eng = make_engine(llm_path, max_num_seqs=4, paged_attention="gather")
    try:
        runner = eng.runner
        runner.static_decode = StaticDecode(runner.model, runner.cache, runner.block_size, 4, runner.max_model_len,
                                            runner.device, capture=False, max_graph_keys=512)
        assert runner.static_decode.shapes == {(1, 256), (1, 512), (2, 256)}
        prompt = {"prompt_token_ids": [(37 * i) % 1000 + 3 for i in range(250)]}
        requests = [StageRequest("long", prompt, greedy()), StageRequest("short", PROMPTS[0], greedy())]
        got, shapes = static_tokens(eng, requests)
        assert got == tokens(eager, requests)
        assert shapes == {(2, 256): 6}  # contexts 251..256; the other 9 decode steps ran eagerly
    finally:
        eng.close()


def test_steps_wanting_hidden_states_stay_eager(eager, static):
    requests = [StageRequest("h", {"prompt": PROMPTS[1], "return_hidden_states": True}, greedy()),
                StageRequest("p", PROMPTS[2], greedy())]
    before = dict(static.runner.static_decode.steps_by_shape)
    want, got = run(eager, requests), run(static, requests)
    assert static.runner.static_decode.steps_by_shape == before  # no decode step of theirs ran static
    for rid in ("h", "p"):
        assert final(got, rid).token_ids == final(want, rid).token_ids
    assert final(got, "h").hidden_states.shape == final(want, "h").hidden_states.shape


@pytest.mark.parametrize("paged_attention", ["gather", "kernel"])
def test_the_captured_forward_never_syncs_with_the_host(llm_path, paged_attention):
    """What `capture()` records, at every (batch size, key length), reads nothing back on the host
    (the check itself catches a sync: the second half)."""
    eng = make_engine(llm_path, max_num_seqs=4, paged_attention=paged_attention)
    try:
        eng.runner.enable_static_decode(4, capture=False)
        recorder = EagerRecorder()
        eng.runner.static_decode.capture(recorder)
        assert recorder.num_recorded == 12 and recorder.host_syncs == []
    finally:
        eng.close()
    x = torch.arange(4)
    for syncing, named in ((lambda: x[0].item(), "item"), (lambda: x[:int(x[3])], "__int__"),
                           (lambda: x[1] if x[2] else x[3], "__bool__"), (lambda: x.nonzero(), "aten.nonzero"),
                           (lambda: x.tolist(), "tolist"), (lambda: x + torch.tensor([1]), "tensor")):
        recorder = EagerRecorder()
        recorder(syncing)
        assert named in recorder.host_syncs


def test_compile_on_cpu_is_refused_by_name(llm_path):
    with pytest.raises(ValueError, match=r"stage 0 \(llm\): compile: true captures .*CUDA device; this stage runs "
                                         r"on cpu\. Remove compile"):
        create_engine(llm_path, LLM, StageDeployConfig(devices=("cpu",), compile=True))


@pytest.mark.parametrize("family", ["qwen2_5_omni.talker", "qwen2_5_omni.thinker", "csm.talker"])
def test_families_that_cannot_be_captured_are_refused_by_name(family):
    model_class = get_ar_model_class(family)
    with pytest.raises(ValueError, match=rf"stage 0 \(llm\): compile: true: {model_class.__name__} cannot be "
                                         r"captured in CUDA graphs"):
        check_cuda_graphs(model_class, "cuda:0", LLM)
    check_cuda_graphs(get_ar_model_class(None), "cuda:0", LLM)  # HFCausalLM can


def test_capture_needs_cuda(static):
    runner = static.runner
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA device, not cpu"):
        StaticDecode(runner.model, runner.cache, runner.block_size, 4, runner.max_model_len, runner.device,
                     capture=True)
