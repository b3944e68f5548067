"""HiDream-I1 (HiDream.ai): text -> image in one diffusion stage."""

from omnistage.config import PipelineSpec, StageSpec, register_pipeline
from omnistage.diffusion.registry import register_diffusion_pipeline

HIDREAM_IMAGE = PipelineSpec(
    name="hidream_image",
    stages=(
        StageSpec(id=0, name="diffusion", kind="diffusion", output="image", final_output=True,
                  model="HiDreamImagePipeline",
                  # Request mode by default: not measured (benchmarks/bench_step_mode.py has no row for it
                  # yet); `step_execution: true` lets short requests join and leave between steps.
                  defaults={"step_execution": False},
        ),
    ),
)

register_pipeline("HiDreamImagePipeline", HIDREAM_IMAGE, deploy_config="hidream_image.yaml")
register_diffusion_pipeline("HiDreamImagePipeline", "omnistage.models.hidream_image.pipeline:HiDreamImage")
