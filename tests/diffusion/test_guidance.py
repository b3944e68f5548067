"""The one guidance function: which rows each transformer call gets, and the combine rules."""

from __future__ import annotations

import torch

from omnistage.diffusion.guidance import Guidance, guided_predictions, norm_clamped_cfg, plain_cfg, rescaled_true_cfg
from omnistage.diffusion.params import DiffusionParams
from omnistage.diffusion.pipeline import DenoiseState
from omnistage.diffusion.request import DiffusionRequest


def state(rid: str, scale: float | None) -> DenoiseState:
    request = DiffusionRequest(rid, "p", DiffusionParams())
    return DenoiseState(request, torch.zeros(1, 2), None, torch.zeros(3), cond={"scale": scale, "cfg_normalization": 0.0})


def run(batch_branches: bool):
    calls = []

    def predict(rows):
        calls.append([(s.request.request_id, b) for s, b in rows])
        return [torch.full((1, 2), 1.0 if b == "cond" else 0.0) for s, b in rows]

    guidance = Guidance(scale=lambda s: s.cond["scale"], combine=plain_cfg, batch_branches=batch_branches)
    states = [state("a", 3.0), state("b", None), state("c", 2.0)]
    return calls, guided_predictions(states, predict, guidance)


def test_split_branches_call_once_per_branch_with_only_the_guided_states():
    calls, preds = run(batch_branches=False)
    assert calls == [[("a", "cond"), ("b", "cond"), ("c", "cond")], [("a", "uncond"), ("c", "uncond")]]
    assert [p[0, 0].item() for p in preds] == [3.0, 1.0, 2.0]  # 0 + s * (1 - 0); b unguided


def test_batched_branches_share_one_call():
    calls, preds = run(batch_branches=True)
    assert calls == [[("a", "cond"), ("b", "cond"), ("c", "cond"), ("a", "uncond"), ("c", "uncond")]]
    assert [p[0, 0].item() for p in preds] == [3.0, 1.0, 2.0]


def test_rescaled_true_cfg_keeps_the_cond_norm_and_norm_clamp_caps_it():
    cond, uncond = torch.tensor([[3.0, 4.0]]), torch.tensor([[1.0, 0.0]])
    out = rescaled_true_cfg(None, cond, uncond, 4.0)
    assert torch.allclose(torch.norm(out, dim=-1), torch.tensor([5.0]))
    s = state("z", 1.0)
    s.cond["cfg_normalization"] = 1.0
    clamped = norm_clamped_cfg(s, cond.unsqueeze(0), uncond.unsqueeze(0), 2.0)  # pos + 2 (pos - neg) = [7, 12]
    assert torch.allclose(torch.linalg.vector_norm(clamped[0]), torch.tensor(5.0))
