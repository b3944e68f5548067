"""SANA-WM: camera-controlled image -> video (a world model) in one diffusion stage."""

from omnistage.config import PipelineSpec, StageSpec, register_pipeline
from omnistage.diffusion.registry import register_diffusion_pipeline


SANA_WM = PipelineSpec(
    name="sana_wm",
    stages=(
        StageSpec(id=0, name="diffusion", kind="diffusion", output="video", final_output=True,
                  model="SanaWMPipeline",
                  # Request mode, not measured: it serves one video at a time (deploy max_num_seqs 1).
                  defaults={"step_execution": False},
        ),
    ),
)

register_pipeline("SanaWMPipeline", SANA_WM, deploy_config="sana_wm.yaml")
register_diffusion_pipeline("SanaWMPipeline", "omnistage.models.sana_wm.pipeline:SanaWM")
