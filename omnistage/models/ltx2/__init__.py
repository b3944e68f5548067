"""LTX-2: text or image -> video with its soundtrack, in one diffusion stage (the MP4 carries the audio)."""

from omnistage.config import PipelineSpec, StageSpec, register_pipeline
from omnistage.diffusion.registry import register_diffusion_pipeline

LTX2_T2V = PipelineSpec(
    name="ltx2_t2v",
    stages=(
        StageSpec(id=0, name="diffusion", kind="diffusion", output="video", final_output=True, model="LTX2Pipeline",
                  # Step mode by default: 1.000x request mode's throughput on the tiny ltx2, at least
                  # the 0.95x of issue 30 (benchmarks/RESULTS.md "Step mode vs request mode").
                  defaults={"step_execution": True},
        ),
    ),
)

LTX2_I2V = PipelineSpec(
    name="ltx2_i2v",
    stages=(
        StageSpec(id=0, name="diffusion", kind="diffusion", output="video", final_output=True,
                  model="LTX2ImageToVideoPipeline",
                  # Request mode: ltx2.yaml serves one video at a time (max_num_seqs 1), so there is no
                  # batch for step mode to join; the same passes as LTX2Pipeline's, one image encode more.
                  defaults={"step_execution": False},
        ),
    ),
)

LTX2_CONDITION = PipelineSpec(
    name="ltx2_condition",
    stages=(
        StageSpec(id=0, name="diffusion", kind="diffusion", output="video", final_output=True,
                  model="LTX2ConditionPipeline",
                  # Request mode: ltx2.yaml serves one video at a time (max_num_seqs 1), so there is no
                  # batch for step mode to join; not measured.
                  defaults={"step_execution": False},
        ),
    ),
)

register_pipeline("LTX2Pipeline", LTX2_T2V, deploy_config="ltx2.yaml")
register_pipeline("LTX2ImageToVideoPipeline", LTX2_I2V, deploy_config="ltx2.yaml")
register_pipeline("LTX2ConditionPipeline", LTX2_CONDITION, deploy_config="ltx2.yaml")
register_diffusion_pipeline("LTX2Pipeline", "omnistage.models.ltx2.pipeline:LTX2T2V")
register_diffusion_pipeline("LTX2ImageToVideoPipeline", "omnistage.models.ltx2.pipeline:LTX2I2V")
register_diffusion_pipeline("LTX2ConditionPipeline", "omnistage.models.ltx2.pipeline:LTX2Condition")
