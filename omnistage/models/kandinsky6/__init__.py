"""Kandinsky 6 TI2VA: text (and an optional first-frame image) -> video with its soundtrack, in
one diffusion stage (the MP4 carries the audio)."""

from omnistage.config import PipelineSpec, StageSpec, register_pipeline
from omnistage.diffusion.registry import register_diffusion_pipeline

KANDINSKY6_TI2VA = PipelineSpec(
    name="kandinsky6_ti2va",
    stages=(
        StageSpec(id=0, name="diffusion", kind="diffusion", output="video", final_output=True,
                  model="Kandinsky6TI2VAPipeline",
                  # Request mode: kandinsky6.yaml serves one video at a time (max_num_seqs 1), so
                  # there is no batch for step mode to join; not measured.
                  defaults={"step_execution": False},
        ),
    ),
)

register_pipeline("Kandinsky6TI2VAPipeline", KANDINSKY6_TI2VA, deploy_config="kandinsky6.yaml")
register_diffusion_pipeline("Kandinsky6TI2VAPipeline", "omnistage.models.kandinsky6.pipeline:Kandinsky6TI2VA")
