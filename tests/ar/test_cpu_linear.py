"""oneDNN prepacked linear layers on CPU (core/cpu_linear.py): same results as `nn.Linear`
up to rounding, and only large plain linears swapped; q/k/v and gate/up fused into one packed
matmul each, computing as transformers' own layers, taking updates of some parts by name and
dropped and read back whole. The AR engine running them with `generate`'s tokens (and 4 matmuls
per layer) is tests/ar/test_ar_parity.py's small-model tests."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from omnistage.core.cpu_linear import (MIN_PACKED_WEIGHT, MIN_PACKED_WEIGHT_TOKEN_ROWS, PrepackedLinear, packable_dtypes,
                                       prepack_linears)

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")
BF16 = pytest.param(torch.bfloat16, 2e-2, marks=pytest.mark.skipif(
    torch.bfloat16 not in packable_dtypes(), reason="this CPU's oneDNN has no bf16 (needs AVX-512 or AVX-NE-CONVERT)"))


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), BF16])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(1, 512), (8, 512), (3, 70, 512)])
@pytest.mark.parametrize("rows", [1, 8])
def test_prepacked_linear_matches_nn_linear(dtype, tol, bias, shape, rows):
    torch.manual_seed(0)
    linear = nn.Linear(512, 768, bias=bias).to(dtype)
    x = torch.randn(*shape, dtype=dtype)
    want = linear(x)
    got = PrepackedLinear(linear, rows)(x)
    assert got.shape == want.shape and got.dtype == want.dtype
    assert (got.float() - want.float()).abs().max() <= tol * want.float().abs().max()


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(1024, 512)
        self.big = nn.Linear(512, 768)
        self.small = nn.Linear(512, 32)  # 16 Ki elements: sgemm is faster at decode sizes
        self.keys = nn.Linear(512, 128)  # 64 Ki: packed for a batched stage (its prefills), not for one row
        self.head = nn.Linear(512, 1024, bias=False)
        self.head.weight = self.embed.weight  # tied: packed as its own copy, the embedding untouched
        self.inner = nn.Sequential(nn.Linear(768, 512), nn.SiLU())


def test_prepack_swaps_large_plain_linears_only():
    block = _Block()
    x = torch.randn(4, 512)
    want = (block.big(x), block.small(x), block.head(x), block.inner(torch.randn(4, 768)))
    assert prepack_linears(block) == 4
    assert isinstance(block.big, PrepackedLinear) and isinstance(block.head, PrepackedLinear)
    assert isinstance(block.inner[0], PrepackedLinear)
    assert type(block.small) is nn.Linear and block.small.weight.numel() < MIN_PACKED_WEIGHT[8]
    assert isinstance(block.keys, PrepackedLinear)
    assert isinstance(block.embed, nn.Embedding) and block.embed.weight.shape == (1024, 512)
    torch.testing.assert_close(block.big(x), want[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(block.head(x), want[2], rtol=1e-5, atol=1e-4)  # N(0, 1) weights: |y| ~ 20
    assert prepack_linears(block) == 0  # already packed: nothing left to swap
    assert block.big.rows == 8


def test_a_token_rows_caller_packs_every_size():
    """A diffusion transformer's matmuls see hundreds of rows: `min_weight=0` packs the small layers too."""
    block = _Block()
    assert prepack_linears(block, min_weight=MIN_PACKED_WEIGHT_TOKEN_ROWS) == 5
    assert isinstance(block.small, PrepackedLinear) and block.small.rows == 8


def test_a_stage_that_never_batches_packs_for_one_row():
    block = _Block()
    assert prepack_linears(block, max_batch=1) == 3
    assert block.big.rows == block.head.rows == 1
    assert type(block.keys) is nn.Linear  # one row: sgemm is faster below 512 x 512, and no prefill is batched


def test_prepack_leaves_other_devices_and_dtypes():
    layers = nn.Sequential(nn.Linear(512, 768).half())
    assert prepack_linears(layers) == 0 and type(layers[0]) is nn.Linear


def test_bf16_is_packed_exactly_where_this_cpu_supports_it():
    """On a CPU without oneDNN bf16 (AVX2 only) the bf16 reorder raises, so such layers stay
    on torch's matmul and the model still loads."""
    layers = nn.Sequential(nn.Linear(512, 768).to(torch.bfloat16))
    supported = torch.ops.mkldnn._is_mkldnn_bf16_supported()
    assert prepack_linears(layers) == int(supported)
    assert isinstance(layers[0], PrepackedLinear) == supported
    x = torch.randn(2, 512, dtype=torch.bfloat16)
    assert layers(x).shape == (2, 768)


def test_prepack_frees_the_unpacked_weights():
    """A packed layer keeps no dense copy of its weight (a tied head's, shared with the
    embedding, stays with the embedding)."""
    import gc
    import weakref

    block = _Block()
    dense = [weakref.ref(block.big.weight), weakref.ref(block.inner[0].weight)]
    prepack_linears(block)
    gc.collect()
    assert all(ref() is None for ref in dense)
    assert not any(p.shape == (768, 512) for p in block.parameters())


class _TiedLM(nn.Module):
    """An embedding and a tied head as transformers declares them (the checkpoint holds the embedding only)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(1024, 512)
        self.proj = nn.Linear(512, 512)
        self.head = nn.Linear(512, 1024, bias=False)
        self.head.weight = self.embed.weight

    def get_expanded_tied_weights_keys(self, all_submodels: bool = False) -> dict[str, str]:
        return {"head.weight": "embed.weight"}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.proj(x))


def test_packed_layers_take_new_weights_and_read_them_back_after_being_dropped():
    from omnistage.core.weights import Dropped, load_weights

    torch.manual_seed(0)
    model, fresh = _TiedLM(), _TiedLM()
    new = {name: t for name, t in fresh.state_dict().items() if name != "head.weight"}  # as a checkpoint stores it
    assert prepack_linears(model) == 2  # proj, and the head as its own packed copy
    x = torch.randn(4, 512)
    with torch.no_grad():
        want = fresh(x)
        assert not torch.allclose(model(x), want, atol=1e-3)
        with pytest.raises(ValueError, match=r"1 shape\(s\) that differ \(proj.weight: \(512, 256\) for \(512, 512\)"):
            load_weights(model, {**new, "proj.weight": new["proj.weight"][:, :256]})  # a packed layer checks it too
        assert load_weights(model, new) == len(new)
        assert torch.allclose(model(x), want, atol=1e-4)  # the packed head followed the embedding
        dropped = Dropped(model, new)
        assert dropped.num_bytes >= (512 * 512 + 1024 * 512 * 2) * 4 and model.proj.packed_weight.numel() == 0
        dropped.restore(model, new)
        assert torch.allclose(model(x), want, atol=1e-4)


def _qwen2(seed: int):
    """A 2-layer transformers Qwen2 whose q/k/v (512 -> 512 + 128 + 128, with biases) and gate/up
    (512 -> 2 x 1024) pass the packing threshold as groups, k and v alone not for one row."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=512, hidden_size=512, intermediate_size=1024, num_hidden_layers=2,
                         num_attention_heads=8, num_key_value_heads=2, tie_word_embeddings=False)
    return Qwen2ForCausalLM(config).eval()


@pytest.mark.parametrize("rows", [1, 8])
def test_fused_siblings_compute_as_transformers_own_layers(rows):
    from omnistage.core.cpu_linear import FusedPrepackedLinear, PackedSlice

    model, reference = _qwen2(0), _qwen2(0)
    assert prepack_linears(model, max_batch=rows, fuse=True) == 2 * 7 + 1
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    assert all(isinstance(m, PackedSlice) for m in (attn.q_proj, attn.k_proj, attn.v_proj, mlp.gate_proj, mlp.up_proj))
    assert attn.q_proj.fused is attn.v_proj.fused and attn.q_proj.fused is not mlp.gate_proj.fused
    assert isinstance(attn.o_proj, PrepackedLinear) and isinstance(mlp.down_proj, PrepackedLinear)
    assert sum(isinstance(m, FusedPrepackedLinear) for m in model.modules()) == 2 * 2
    ids = torch.randint(0, 512, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, reference(ids).logits, rtol=1e-4, atol=1e-4)
        assert attn.q_proj.fused._outputs is None  # every sibling took its columns: no activation kept


def test_a_sibling_called_on_other_states_computes_afresh():
    """k and v on another tensor than q (cross-attention), or a sibling called twice: the same
    values as its own linear, never another input's columns."""
    torch.manual_seed(0)
    linears = {name: nn.Linear(512, 256) for name in ("q_proj", "k_proj", "v_proj")}
    block = nn.Module()
    for name, linear in linears.items():
        block.add_module(name, nn.Linear(512, 256))
        block.get_submodule(name).load_state_dict(linear.state_dict())
    prepack_linears(block, fuse=True)
    x, states = torch.randn(3, 512), torch.randn(5, 512)
    with torch.no_grad():
        for layer, name, inp in [(block.q_proj, "q_proj", x), (block.k_proj, "k_proj", states),
                                 (block.v_proj, "v_proj", states), (block.v_proj, "v_proj", states),
                                 (block.k_proj, "k_proj", x), (block.k_proj, "k_proj", x)]:
            torch.testing.assert_close(layer(inp), linears[name](inp), rtol=1e-5, atol=1e-5)


def test_fused_siblings_take_new_weights_by_name_and_read_them_back_after_being_dropped():
    """An update of some siblings only (`q_proj.weight` and `up_proj.bias`-less MLP's `up_proj.weight`)
    keeps the others; sleep level 2 frees the fused matrix once and reads every part back."""
    from omnistage.core.weights import Dropped, load_weights

    model, fresh = _qwen2(0), _qwen2(1)
    want_model = _qwen2(0)
    update = {name: t for name, t in fresh.state_dict().items()
              if name.endswith(("self_attn.q_proj.weight", "self_attn.k_proj.bias", "mlp.up_proj.weight"))}
    want_model.load_state_dict(update, strict=False)
    prepack_linears(model, fuse=True)
    ids = torch.randint(0, 512, (1, 7))
    with torch.no_grad():
        assert not torch.allclose(model(ids).logits, want_model(ids).logits, atol=1e-3)
        with pytest.raises(ValueError, match=r"model.layers.0.self_attn.q_proj.weight: \(512, 256\) for \(512, 512\)"):
            load_weights(model, {**update, "model.layers.0.self_attn.q_proj.weight": torch.zeros(512, 256)})
        assert load_weights(model, update) == len(update) == 2 * 3
        torch.testing.assert_close(model(ids).logits, want_model(ids).logits, rtol=1e-4, atol=1e-4)
        checkpoint = want_model.state_dict()
        dropped = Dropped(model, checkpoint)
        fused = model.model.layers[0].self_attn.q_proj.fused
        assert not fused.packed_weight.is_mkldnn
        # per layer q/k/v (768 x 512) and gate/up (2048 x 512) once each, o and down; the head, the
        # embedding and the norms (the fused biases are kept)
        assert dropped.num_bytes == 4 * (2 * (768 * 512 + 2048 * 512 + 512 * 512 + 1024 * 512) + 2 * 512 * 512 + 5 * 512)
        dropped.restore(model, checkpoint)
        torch.testing.assert_close(model(ids).logits, want_model(ids).logits, rtol=1e-4, atol=1e-4)
        assert fused.packed_weight.is_mkldnn  # packed again, on its first call
