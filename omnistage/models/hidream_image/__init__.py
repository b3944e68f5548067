"""HiDream-I1 (HiDream.ai): text -> image in one diffusion stage."""

from omnistage.config import PipelineSpec, StageSpec, register_pipeline
from omnistage.diffusion.registry import register_diffusion_pipeline

HIDREAM_IMAGE = PipelineSpec(
    name="hidream_image",
    stages=(
        StageSpec(id=0, name="diffusion", kind="diffusion", output="image", final_output=True,
                  model="HiDreamImagePipeline",
                  # Request mode by default: step mode made 0.909x its throughput on the tiny hidream-image,
                  # more than 5% less (benchmarks/bench_step_mode.py --models hidream-image --no-write, one run
                  # on a shared machine; not yet in RESULTS.md). `step_execution: true` trades that for short
                  # requests not waiting behind long ones.
                  defaults={"step_execution": False},
        ),
    ),
)

register_pipeline("HiDreamImagePipeline", HIDREAM_IMAGE, deploy_config="hidream_image.yaml")
register_diffusion_pipeline("HiDreamImagePipeline", "omnistage.models.hidream_image.pipeline:HiDreamImage")
