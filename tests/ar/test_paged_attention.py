"""Attention that reads the paged KV cache in place (omnistage/ar/paged_attention.py, the CPU
kernel in omnistage/ar/kernels/paged_attention.cpp, the CUDA one in kernels/paged_attention_triton.py).

- the kernel against a gather + SDPA written out here, on random block tables: decode rows,
  prompt chunks after cached keys and from position 0, grouped key heads, fp32 and bf16;
- the CUDA (Triton) kernel on the same cases, run on CPU tensors by Triton's interpreter, against
  the same reference and the CPU kernel (fp32: the interpreter's bf16 matmul is wrong; bf16 is
  checked on a GPU, tests/gpu/test_paged_attention_cuda.py), and compiled ahead of time for sm_90
  (no GPU needed) at the constants a launch uses;
- the engine with the kernel against transformers' `generate` and against the engine that
  gathers, tokens and per-token logprobs, with a stream decoding while two long prompts are
  prefilled in chunks beside it, one of them after a prefix-cache hit. The kernel is the
  default on CPU, so test_ar_paged.py (prefix hits, chunked prefill, preemption),
  test_ar_parity.py and test_mutations.py (which breaks the cache under it) run it too;
  test_ar_packed.py runs the gather path.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ar_helpers import LOGPROB_ATOL, assert_matches_reference, final, join_two_long_prompts, make_engine, \
    reference_generate
from omnistage.ar.paged_attention import PagedLayout, kernel_for, uses_kernel
from omnistage.ar.sampling_params import SamplingParams
from test_ar_paged import assert_no_leak, token_prompts

ROOT = Path(__file__).resolve().parents[2]
BLOCK = 16
ROWS = [(1, 100), (1, 37), (1, 0), (20, 60), (5, 5), (40, 0), (33, 17), (3, 0), (16, 32)]
"""(tokens fed, keys cached before them) per row: decodes, chunks after cached keys, prompts from 0."""


def random_case(heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    num_blocks = 1 + sum(-(-(n + c) // BLOCK) for n, c in ROWS) + 5
    keys = torch.randn(num_blocks * BLOCK, kv_heads, head_dim, generator=g).to(dtype)
    values = torch.randn(num_blocks * BLOCK, kv_heads, head_dim, generator=g).to(dtype)
    free = (torch.randperm(num_blocks - 1, generator=g) + 1).tolist()  # block 0: the scratch block
    width = max(-(-(n + c) // BLOCK) for n, c in ROWS)
    tables = []
    for n, c in ROWS:
        row = [free.pop() for _ in range(-(-(n + c) // BLOCK))]
        tables.append(row + [0] * (width - len(row)))
    query = torch.randn(1, sum(n for n, _ in ROWS), heads, head_dim, generator=g).to(dtype).transpose(1, 2)
    return keys, values, tables, query


def gather_sdpa(keys, values, tables, query) -> torch.Tensor:
    """Each row's keys gathered in position order, then SDPA with its causal mask (fp32)."""
    out, first = [], 0
    for (n, cached), table in zip(ROWS, tables):
        slots = (torch.tensor(table)[:, None] * BLOCK + torch.arange(BLOCK)).flatten()[:n + cached]
        k, v = keys[slots].float().transpose(0, 1), values[slots].float().transpose(0, 1)
        q = query[0, :, first:first + n].float()
        causal = torch.arange(n + cached)[None, :] <= cached + torch.arange(n)[:, None]
        o = torch.nn.functional.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=causal,
                                                             enable_gqa=True)
        out.append(o[0].transpose(0, 1))
        first += n
    return torch.cat(out)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(8, 2, 64), (2, 1, 64), (4, 4, 32), (2, 1, 40)])
def test_kernel_equals_gather_and_sdpa_on_random_block_tables(dtype, heads, kv_heads, head_dim):
    kernel = kernel_for(torch.device("cpu"))
    keys, values, tables, query = random_case(heads, kv_heads, head_dim, dtype)
    # the in-place cache's key pool: blocks transposed, written by the kernel's own write_keys
    key_pool = torch.zeros(keys.shape[0] // BLOCK, kv_heads, head_dim, BLOCK, dtype=dtype)
    kernel.write_keys(key_pool, keys, torch.arange(keys.shape[0]))
    assert torch.equal(key_pool.permute(0, 3, 1, 2).reshape(keys.shape), keys)
    starts = torch.tensor([0] + [n for n, _ in ROWS]).cumsum(0)
    layout = PagedLayout(torch.tensor(tables, dtype=torch.int32), starts.to(torch.int32),
                         torch.tensor([n + c for n, c in ROWS], dtype=torch.int32))
    got = kernel.paged_attention(query[0].transpose(0, 1), key_pool, values, layout.block_tables,
                                 layout.query_starts, layout.context_lens, head_dim ** -0.5)
    want = gather_sdpa(keys, values, tables, query)
    assert got.dtype == dtype and got.shape == want.shape
    # bf16: the kernel sums in fp32 like the reference; only its output is rounded to bf16
    torch.testing.assert_close(got.float(), want, atol=1e-5 if dtype == torch.float32 else 1e-2, rtol=0)


TRITON_CASES = [(8, 2, 64), (2, 1, 40), (4, 4, 32)]
"""(heads, kv heads, head dim) of the Triton kernel's cases: GQA, MHA, a head dim that is no power of 2."""

RUN_INTERPRETED = """
import sys, torch
from omnistage.ar.kernels import paged_attention_triton as kernel
cases = torch.load(sys.argv[1])
for case in cases:
    kernel.write_keys(case["key_pool"], case["keys"], case["slots"])
    case["out"] = kernel.paged_attention(case["query"], case["key_pool"], *case["args"])
torch.save(cases, sys.argv[1])
"""
"""Run in a child process: Triton's interpreter is chosen by TRITON_INTERPRET when triton is first
imported (its own library functions are wrapped then), and this process has imported it already
(transformers does), compiled."""


def test_triton_kernel_equals_gather_and_sdpa_and_the_cpu_kernel(tmp_path):
    cases, references = [], []
    for heads, kv_heads, head_dim in TRITON_CASES:
        keys, values, tables, query = random_case(heads, kv_heads, head_dim, torch.float32)
        slots = torch.randperm(keys.shape[0], generator=torch.Generator().manual_seed(1))  # written in any order
        starts = torch.tensor([0] + [n for n, _ in ROWS]).cumsum(0)
        args = (values, torch.tensor(tables, dtype=torch.int32), starts.to(torch.int32),
                torch.tensor([n + c for n, c in ROWS], dtype=torch.int32), head_dim ** -0.5)
        cases.append(dict(key_pool=torch.zeros(keys.shape[0] // BLOCK, kv_heads, head_dim, BLOCK),
                          keys=keys[slots], slots=slots, query=query[0].transpose(0, 1), args=args))
        references.append((keys, gather_sdpa(keys, values, tables, query)))
    torch.save(cases, tmp_path / "cases.pt")
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    subprocess.run([sys.executable, "-c", RUN_INTERPRETED, str(tmp_path / "cases.pt")], env=env, check=True,
                   timeout=120)
    cpu_kernel = kernel_for(torch.device("cpu"))
    for case, (keys, want) in zip(torch.load(tmp_path / "cases.pt"), references):
        assert torch.equal(case["key_pool"].permute(0, 3, 1, 2).reshape(keys.shape), keys)
        got = case["out"]
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
        torch.testing.assert_close(got, cpu_kernel.paged_attention(case["query"], case["key_pool"], *case["args"]),
                                   atol=1e-5, rtol=0)


@pytest.mark.parametrize("dtype,heads,kv_heads,head_dim",
                         [(torch.float32, 8, 2, 128), (torch.bfloat16, 2, 1, 40), (torch.float16, 4, 4, 64)], ids=str)
def test_triton_kernel_compiles_for_a_cuda_gpu(dtype, heads, kv_heads, head_dim):
    """The interpreter checks what the kernel computes, not that Triton can compile it (it enforces
    neither tl.dot's operand shapes nor shared memory): compiled here ahead of time, no GPU needed,
    for an H100/H200 (sm_90) down to its cubin, at the constants a launch would use."""
    import inspect

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from omnistage.ar.kernels import paged_attention_triton as kernel

    constants = kernel.launch_constants(dtype, heads, kv_heads, head_dim, head_dim, rows=len(ROWS))
    names = list(inspect.signature(kernel.attend_blocks.fn).parameters)
    element = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]
    pointers = {"query": element, "keys": element, "values": element, "out": element, "tables": "i32",
                "query_starts": "i32", "context_lens": "i32"}
    signature = {name: "constexpr" if name in constants else f"*{pointers[name]}" if name in pointers
                 else "fp32" if name == "scale" else "i32" for name in names}
    source = ASTSource(fn=kernel.attend_blocks, signature=signature,
                       constexprs={(names.index(name),): value for name, value in constants.items()})
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32))
    assert compiled.asm["cubin"] and compiled.metadata.shared <= 227 * 1024  # sm_90's shared memory per block


def kernel_and_gather_outputs(make):
    """Each prompt's final output from the engine `make("kernel")` and from `make("gather")` (and the
    prompts): a stream decodes while two 40-token prompts join, prefilled in chunks of the 16-token
    budget beside it; the second shares the first's 32-token prefix, so with prefix caching it starts
    after the cached blocks of it that the first had filled. Every step of the kernel's engine but the
    stream's own first prefill attends through a `PagedLayout`."""
    params = SamplingParams(max_tokens=10, temperature=0.0, logprobs=0)
    short, first = token_prompts(1, 5, seed=3) + token_prompts(1, 40, seed=4)
    second = first[:32] + token_prompts(1, 8, seed=5)[0]
    finals, layouts = {}, []
    for setting in ("kernel", "gather"):
        engine = make(setting)
        assert engine.runner.in_place == (setting == "kernel")
        forward = engine.model.forward

        def spy(batch, cache, forward=forward, setting=setting):
            if setting == "kernel":
                layouts.append(isinstance(batch.attention_mask, PagedLayout))
            return forward(batch, cache)

        engine.model.forward = spy
        outputs = join_two_long_prompts(engine, short, [first, second], params)
        finals[setting] = {name: final(outputs, name) for name in "sab"}
        assert outputs["b"][-1].metrics["num_cached_tokens"] >= 16  # a's blocks full when b was admitted
        assert_no_leak(engine)
        engine.close()
    assert sum(layouts) >= len(layouts) - 1  # all but the stream's own first prefill (position 0, alone)
    return finals, (short, first, second)


def test_the_engine_reads_blocks_in_place_with_generates_and_the_gather_paths_tokens(llm_path, hf_model):
    finals, (short, first, second) = kernel_and_gather_outputs(lambda setting: make_engine(
        llm_path, max_num_seqs=4, max_num_batched_tokens=16, paged_attention=setting))
    for name, prompt, max_new in (("s", short, 24), ("a", first, 10), ("b", second, 10)):
        assert_matches_reference(finals["kernel"][name], reference_generate(hf_model, prompt, max_new), name)
        kernel, gather = finals["kernel"][name], finals["gather"][name]
        assert kernel.token_ids == gather.token_ids
        assert max(abs(a.logprob - b.logprob) for a, b in zip(kernel.logprobs, gather.logprobs)) <= LOGPROB_ATOL


def test_selection_auto_kernel_gather(llm_path):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert uses_kernel("auto", cpu, True)  # the kernel built here: the default on CPU
    assert not uses_kernel("auto", cpu, False)  # a model whose layers are not plain causal: gather
    assert not uses_kernel("gather", cpu, True)
    assert not uses_kernel("auto", cuda, True)  # CUDA gathers by default until the kernel has run on a GPU
    assert uses_kernel("kernel", cuda, True)  # the Triton kernel imports (it compiles at its first launch)
    assert not uses_kernel("auto", torch.device("mps"), True)
    with pytest.raises(ValueError, match="paged_attention: kernel: no in-place paged attention kernel for mps"):
        uses_kernel("kernel", torch.device("mps"), True)
    with pytest.raises(ValueError, match="paged_attention: kernel: this model's attention is not plain causal"):
        uses_kernel("kernel", cpu, False)
    from omnistage.config.deploy_fields import StageDeployConfig

    with pytest.raises(ValueError, match="paged_attention"):
        StageDeployConfig(paged_attention="inplace")
    engine = make_engine(llm_path, max_num_seqs=1, max_model_len=64)
    assert engine.runner.in_place and engine.runner.cache.in_place
    engine.close()


def test_without_triton_a_cuda_stage_gathers_or_refuses_saying_why(monkeypatch):
    from omnistage.ar import kernels, paged_attention

    monkeypatch.setitem(sys.modules, "triton", None)  # `import triton` raises ImportError
    # the kernel's module imported afresh (it imports triton first)
    monkeypatch.delitem(sys.modules, "omnistage.ar.kernels.paged_attention_triton", raising=False)
    monkeypatch.delattr(kernels, "paged_attention_triton", raising=False)
    paged_attention._load_triton_kernel.cache_clear()
    try:
        cuda = torch.device("cuda")
        assert not uses_kernel("auto", cuda, True)
        with pytest.raises(ValueError, match="paged_attention: kernel: the CUDA kernel needs triton, which does "
                                             "not import"):
            uses_kernel("kernel", cuda, True)
        assert uses_kernel("auto", torch.device("cpu"), True)  # the CPU kernel needs no triton
    finally:
        paged_attention._load_triton_kernel.cache_clear()


def test_a_layer_with_more_than_plain_causal_attention_is_refused():
    from omnistage.ar.paged_attention import attend_in_place

    layout = PagedLayout(*(torch.zeros(1, dtype=torch.int32) for _ in range(3)))
    with pytest.raises(ValueError, match=r"\['s_aux'\]; set paged_attention: gather"):
        attend_in_place(None, torch.zeros(1, 2, 1, 8), None, None, layout, s_aux=torch.zeros(2))
    with pytest.raises(ValueError, match="sliding_window"):
        attend_in_place(None, torch.zeros(1, 2, 1, 8), None, None, layout, sliding_window=4)

