"""Each diffusion family declares its default scheduling mode in its `StageSpec.defaults`:
step mode where it measured within 5% of request mode's throughput (benchmarks/RESULTS.md
"Step mode vs request mode"), request mode elsewhere; a deploy value always wins."""

from __future__ import annotations

import pytest

from omnistage.config.effective import resolve_config
from omnistage.testing import list_models

# Zoo family -> its declared step_execution (the measured ratio is beside each declaration).
EXPECTED = {
    "flux": True, "flux2": True, "flux2-klein": True, "glm-image": True, "hunyuan-video": True,
    "hunyuan-video-i2v": True, "ltx2": True, "qwen-image": False, "qwen-image-2.1": False,
    "qwen-image-edit": True, "qwen-image-edit-plus": True, "sd3": False, "stable-audio": False,
    "wan-i2v": True, "wan-t2v": False, "z-image": False,
    # wave 3 (measured in a second run of the same script on these six families)
    "sdxl": True, "flux-kontext": False, "ernie-image": False, "ovis-image": True, "krea2": False,
    "longcat-image": True,
    # wave 4 (bench_step_mode --models ... --no-write on these three; not yet in RESULTS.md)
    "longcat-image-edit": True, "qwen-image-layered": True, "hidream-image": False,
    # issue 32's video families (a third run of the same script)
    "sana-video": True, "sana-video-i2v": True, "wan-vace": True,
    # issue 35's Helios (a fourth run)
    "helios": True,
    # issue 32's image families
    "joyai-image-edit": True, "sdxl-refiner": False,
    # request mode, not measured: video families serve one request at a time (max_num_seqs 1)
    "ltx2-i2v": False, "ltx2-condition": False, "kandinsky6": False, "cosmos3": False, "sana-wm": False,
    # request mode: issue 32's LTX-2 upsampler (one pass a request, no steps to join) and
    # JoyAI-Image-Edit-Plus (step mode's staggered latency 1.44x request mode's, bench_diffusion)
    "ltx2-latent-upsampler": False, "joyai-image-edit-plus": False,
}


def diffusion_stage(config):
    [stage] = [s for s in config.pipeline.stages if s.kind == "diffusion"]
    return stage


def test_every_diffusion_family_of_the_zoo_is_covered():
    assert set(EXPECTED) == {m.name for m in list_models() if m.kind == "diffusion"}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_family_resolves_to_its_declared_default(zoo, name):
    config = resolve_config(zoo(name))
    stage = diffusion_stage(config)
    assert "step_execution" in stage.defaults, f"{name} declares no default scheduling mode"
    assert config.stage_config(stage.id).step_execution is EXPECTED[name]


@pytest.mark.parametrize("name", ["flux", "z-image"])  # one of each default
def test_an_explicit_deploy_value_overrides_the_family_default(zoo, tmp_path, name):
    flipped = not EXPECTED[name]
    stage_id = diffusion_stage(resolve_config(zoo(name))).id
    by_override = resolve_config(zoo(name), stage_overrides={str(stage_id): {"step_execution": flipped}})
    assert by_override.stage_config(stage_id).step_execution is flipped
    deploy = tmp_path / "deploy.yaml"  # a user's own file, not inheriting the bundled one
    deploy.write_text(f"stages:\n  - id: {stage_id}\n    step_execution: {str(flipped).lower()}\n")
    assert resolve_config(zoo(name), deploy).stage_config(stage_id).step_execution is flipped


def test_a_user_deploy_file_that_leaves_it_unset_keeps_the_family_default(zoo, tmp_path):
    deploy = tmp_path / "deploy.yaml"
    deploy.write_text("stages:\n  - id: 0\n    max_num_seqs: 2\n")
    assert resolve_config(zoo("flux"), deploy).stage_config(0).step_execution is True
