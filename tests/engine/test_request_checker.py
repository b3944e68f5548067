"""`factory.request_checker`: the diffusion engine's own request check, run without weights
where the orchestrator is (the videos route asks it before answering for a job)."""

from __future__ import annotations

import pytest

from omnistage.config import StageDeployConfig, StageSpec
from omnistage.core.errors import RequestError
from omnistage.core.types import StageRequest
from omnistage.diffusion.params import DiffusionParams
from omnistage.engine.factory import create_engine, request_checker

STAGE = StageSpec(0, "diffusion", "diffusion", "video", final_output=True, model="WanPipeline")


def test_the_diffusion_check_refuses_what_add_request_refuses(zoo):
    check = request_checker(create_engine, str(zoo("wan-t2v")), STAGE, StageDeployConfig())
    check(StageRequest("ok", "a wave", DiffusionParams(num_inference_steps=2, extras={"max_sequence_length": 16})))
    with pytest.raises(RequestError, match="unknown extras") as bad:
        check(StageRequest("bad", "a wave", DiffusionParams(extras={"bogus": 1})))
    assert bad.value.param == "bogus"


def test_a_factory_without_a_check_offers_none():
    def factory(model_path, stage, config):  # a bare function: no request_checker to offer
        raise AssertionError("never built")

    assert request_checker(factory, "/nowhere", STAGE, StageDeployConfig()) is None
