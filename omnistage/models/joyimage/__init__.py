"""JoyAI-Image-Edit (JD): an input image and an instruction -> image in one diffusion stage; and
JoyAI-Image-Edit-Plus: several reference images and an instruction -> image (plus.py)."""

from omnistage.config import PipelineSpec, StageSpec, register_pipeline
from omnistage.diffusion.registry import register_diffusion_pipeline

JOYIMAGE_EDIT = PipelineSpec(
    name="joyimage_edit",
    stages=(
        StageSpec(id=0, name="diffusion", kind="diffusion", output="image", final_output=True,
                  model="JoyImageEditPipeline",
                  # Step mode by default: 1.063x request mode's throughput by CPU time (0.780x by wall clock
                  # at load 13 on 2 cores) on the tiny joyai-image-edit at 64x64 (benchmarks/bench_step_mode.py
                  # --models joyai-image-edit --no-write, one run on a shared machine; not yet in RESULTS.md).
                  defaults={"step_execution": True},
        ),
    ),
)

JOYIMAGE_EDIT_PLUS = PipelineSpec(
    name="joyimage_edit_plus",
    stages=(
        StageSpec(id=0, name="diffusion", kind="diffusion", output="image", final_output=True,
                  model="JoyImageEditPlusPipeline",
                  # Request mode: under staggered arrivals step mode's mean latency was 1.44x request mode's
                  # on the tiny joyai-image-edit-plus (benchmarks/RESULTS.md "Diffusion: JoyAI-Image-Edit-Plus").
                  defaults={"step_execution": False},
        ),
    ),
)

register_pipeline("JoyImageEditPipeline", JOYIMAGE_EDIT, deploy_config="joyimage_edit.yaml")
register_diffusion_pipeline("JoyImageEditPipeline", "omnistage.models.joyimage.pipeline:JoyImageEdit")
register_pipeline("JoyImageEditPlusPipeline", JOYIMAGE_EDIT_PLUS, deploy_config="joyimage_edit.yaml")
register_diffusion_pipeline("JoyImageEditPlusPipeline", "omnistage.models.joyimage.plus:JoyImageEditPlus")
