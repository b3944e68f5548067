"""The CUDA paged-attention kernel (omnistage/ar/kernels/paged_attention_triton.py) compiled by
Triton on a GPU (the CPU suite runs it in Triton's interpreter, fp32 only: tests/ar/
test_paged_attention.py):

- against a gather + SDPA on random block tables (decode rows, prompt chunks after cached keys
  and from position 0, grouped key heads, head dims 128, 64, 40 and 32), fp32 and bf16;
- the AR engine on the zoo's tiny qwen2-llm reading the blocks in place against the engine that
  gathers, fp32: tokens and logprobs, with a stream decoding while two long prompts are prefilled
  in chunks beside it, one after a prefix-cache hit;
- `compile: true` with the kernel: decode steps replayed from CUDA graphs that read the blocks in
  place give the gathering eager engine's tokens, and the graphs ran.
"""

from __future__ import annotations

import pytest
import torch
from ar_helpers import LOGPROB_ATOL, PROMPTS, final, run
from test_paged_attention import BLOCK, ROWS, gather_sdpa, kernel_and_gather_outputs, random_case

from omnistage.ar.paged_attention import kernel_for
from omnistage.ar.sampling_params import SamplingParams
from omnistage.config.deploy_fields import StageDeployConfig
from omnistage.config.spec import StageSpec
from omnistage.core.types import StageRequest
from omnistage.engine.factory import create_engine

pytestmark = pytest.mark.gpu

LLM = StageSpec(id=0, name="llm", kind="ar", output="text", final_output=True)
CONFIG = dict(devices=("cuda:0",), dtype="float32", max_num_seqs=4, max_model_len=512)


@pytest.fixture(scope="module")
def llm_path(zoo) -> str:
    return str(zoo("qwen2-llm", size="tiny"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(8, 2, 64), (4, 4, 32), (2, 1, 40), (16, 2, 128)])
def test_kernel_equals_gather_and_sdpa_on_cuda(dtype, heads, kv_heads, head_dim, report):
    kernel = kernel_for(torch.device("cuda"))
    keys, values, tables, query = random_case(heads, kv_heads, head_dim, dtype)
    key_pool = torch.zeros(keys.shape[0] // BLOCK, kv_heads, head_dim, BLOCK, dtype=dtype, device="cuda")
    slots = torch.randperm(keys.shape[0], generator=torch.Generator().manual_seed(1))  # written in any order
    kernel.write_keys(key_pool, keys[slots].cuda(), slots.cuda())
    assert torch.equal(key_pool.permute(0, 3, 1, 2).reshape(keys.shape).cpu(), keys)
    starts = torch.tensor([0] + [n for n, _ in ROWS]).cumsum(0)
    got = kernel.paged_attention(query[0].transpose(0, 1).cuda(), key_pool, values.cuda(),
                                 torch.tensor(tables, dtype=torch.int32, device="cuda"),
                                 starts.to(device="cuda", dtype=torch.int32),
                                 torch.tensor([n + c for n, c in ROWS], dtype=torch.int32, device="cuda"),
                                 head_dim ** -0.5)
    want = gather_sdpa(keys, values, tables, query)  # fp32, on CPU
    assert got.dtype == dtype and got.shape == want.shape
    diff = (got.float().cpu() - want).abs().max().item()
    report(f"paged_attention_triton[{heads}-{kv_heads}-{head_dim}-{dtype}]", max_abs_diff=diff)
    # fp32: full-precision matmuls (no TF32); bf16: the probabilities meet the values in bf16, as in
    # flash attention, and the output is rounded to bf16
    torch.testing.assert_close(got.float().cpu(), want, atol=1e-5 if dtype == torch.float32 else 1e-2, rtol=0)


def test_the_engine_reads_blocks_in_place_with_the_gather_paths_tokens_and_logprobs(llm_path):
    finals, _ = kernel_and_gather_outputs(lambda setting: create_engine(llm_path, LLM, StageDeployConfig(
        max_num_batched_tokens=16, enable_prefix_caching=True, paged_attention=setting, **CONFIG)))
    for name in "sab":
        kernel, gather = finals["kernel"][name], finals["gather"][name]
        assert kernel.token_ids == gather.token_ids, name
        assert max(abs(a.logprob - b.logprob) for a, b in zip(kernel.logprobs, gather.logprobs)) <= LOGPROB_ATOL


def tokens(engine, requests) -> dict[str, list[int]]:
    outputs = run(engine, requests)
    return {rid: final(outputs, rid).token_ids for rid in outputs}


def test_cuda_graphs_read_the_blocks_in_place_with_the_gather_paths_tokens(llm_path):
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    alone = [StageRequest("alone", PROMPTS[0], params)]
    ragged = [StageRequest(f"r{i}", p, params) for i, p in enumerate(PROMPTS[1:])]  # three rows, padded to four
    got = {}
    for setting, compile_ in (("kernel", True), ("gather", False)):
        engine = create_engine(llm_path, LLM, StageDeployConfig(compile=compile_, paged_attention=setting, **CONFIG))
        got[setting] = tokens(engine, alone) | tokens(engine, ragged)
        if compile_:
            static = engine.runner.static_decode
            assert static.in_place and static.num_replays == sum(static.steps_by_shape.values()) > 0
        engine.close()
    assert got["kernel"] == got["gather"] and len(got["kernel"]) == 4
