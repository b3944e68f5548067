"""Ring attention's per-chunk kernel (`attention_with_lse`): a fused attention that returns the
log-sum-exp, so a ring merges chunks without materialising [B, H, S, S] scores. Its output and
lse match the plain math, a key-padding mask is honoured, an all-padding row adds nothing, and
two chunks merged by their lse give attention over both (what each ring step does)."""

from __future__ import annotations

import pytest
import torch

from omnistage.diffusion.accel.ring_attention import attention_with_lse

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def reference(q, k, v, mask):
    scores = (q.double() @ k.double().transpose(-1, -2)) * q.shape[-1] ** -0.5
    if mask is not None:
        scores = scores.masked_fill(~mask[:, None, None, :], float("-inf"))
    lse = torch.logsumexp(scores, dim=-1, keepdim=True)
    return torch.softmax(scores, dim=-1).nan_to_num() @ v.double(), lse


@pytest.mark.parametrize("device", DEVICES)
def test_output_and_lse_match_the_math(device):
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 24, 16, device=device) for _ in range(3))
    mask = torch.ones(2, 24, dtype=torch.bool, device=device)
    mask[1, 17:] = False
    for m in (None, mask):
        out, lse = attention_with_lse(q, k, v, m)
        want_out, want_lse = reference(q, k, v, m)
        torch.testing.assert_close(out.double(), want_out, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(lse.double(), want_lse, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_all_padding_row_adds_nothing_and_chunks_merge(device):
    torch.manual_seed(1)
    q, k, v = (torch.randn(2, 2, 8, 16, device=device) for _ in range(3))
    mask = torch.ones(2, 8, dtype=torch.bool, device=device)
    mask[0, 4:] = False  # row 0's second chunk is all padding
    first = attention_with_lse(q, k[:, :, :4], v[:, :, :4], mask[:, :4])
    second = attention_with_lse(q, k[:, :, 4:], v[:, :, 4:], mask[:, 4:])
    assert torch.isinf(second[1][0]).all() and (second[0][0] == 0).all()
    lse = torch.logaddexp(first[1], second[1])
    merged = first[0] * torch.exp(first[1] - lse) + second[0] * torch.exp(second[1] - lse)
    torch.testing.assert_close(merged.double(), reference(q, k, v, mask)[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_bf16_runs_in_its_own_dtype(device):
    q, k, v = (torch.randn(1, 2, 32, 64, device=device, dtype=torch.bfloat16) for _ in range(3))
    out, lse = attention_with_lse(q, k, v, None)
    want, _ = reference(q, k, v, None)
    assert out.dtype == lse.dtype == torch.float32
    torch.testing.assert_close(out.double(), want, atol=2e-2, rtol=2e-2)
