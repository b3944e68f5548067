"""JoyAI-Image-Edit (JD): an input image and an instruction -> image in one diffusion stage."""

from omnistage.config import PipelineSpec, StageSpec, register_pipeline
from omnistage.diffusion.registry import register_diffusion_pipeline

JOYIMAGE_EDIT = PipelineSpec(
    name="joyimage_edit",
    stages=(
        StageSpec(id=0, name="diffusion", kind="diffusion", output="image", final_output=True,
                  model="JoyImageEditPipeline",
                  # Request mode by default: step mode's throughput ratio on the tiny joyai-image-edit is
                  # not measured yet. `step_execution: true` lets short requests overtake long ones.
                  defaults={"step_execution": False},
        ),
    ),
)

register_pipeline("JoyImageEditPipeline", JOYIMAGE_EDIT, deploy_config="joyimage_edit.yaml")
register_diffusion_pipeline("JoyImageEditPipeline", "omnistage.models.joyimage.pipeline:JoyImageEdit")
