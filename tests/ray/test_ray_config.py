"""Ray settings that are wrong fail at start-up with an error that names what to change:
Ray not installed, resources no node offers, `connector: ray` on a process stage."""

from __future__ import annotations

import sys

import pytest

from omnistage.config.deploy_fields import StageDeployConfig
from omnistage.config.spec import StageSpec
from omnistage.runtime import ray as ray_utils
from omnistage.engine.factory import create_engine
from omnistage.engine.stage_handle import make_stage_handle

STAGE = StageSpec(id=0, name="diffusion", kind="diffusion", output="image", final_output=True, model="ZImagePipeline")


def test_without_ray_the_error_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # what `import ray` meets when it is not installed
    with pytest.raises(ImportError, match=r"pip install 'omnistage\[ray\]'"):
        ray_utils.import_ray()


def test_connector_ray_on_a_process_stage_is_refused():
    with pytest.raises(ValueError, match="connector 'ray'.*runtime 'process'"):
        make_stage_handle(STAGE, StageDeployConfig(runtime="process"), "unused", create_engine, connector="ray")


def test_resources_no_node_offers_are_named_at_start(ray_cluster):
    from omnistage.diffusion.executor.ray import RayExecutor
    from omnistage.diffusion.worker import WorkerConfig

    with pytest.raises(ValueError, match=r"stage 0 \(diffusion\): ray_resources: no node .*'node_c': 1\.0"):
        make_stage_handle(STAGE, StageDeployConfig(runtime="ray", ray_resources={"node_c": 1}), "unused",
                          create_engine)
    config = StageDeployConfig(executor="ray", num_devices=2, ulysses_degree=2, ray_resources={"CPU": 64})
    with pytest.raises(ValueError, match=r"executor 'ray': ray_resources: no node .*'CPU': 64\.0"):
        RayExecutor(WorkerConfig("unused", object, ("cpu", "cpu"), config))
