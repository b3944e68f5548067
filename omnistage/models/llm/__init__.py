"""Plain text LLMs: one autoregressive stage, prompt -> text.

Qwen2 is registered by name. Any other `*ForCausalLM` checkpoint gets the same one-stage
pipeline through a pattern key, tried only after every exact key, because the native AR
backend loads it with transformers' AutoModelForCausalLM whatever its architecture.
Multi-stage families that happen to use a *ForCausalLM class register exact keys, which
win.
"""

from omnistage.config import PipelineSpec, StageSpec, register_pipeline


def text_llm(name: str) -> PipelineSpec:
    # model=None: the AR engine loads the checkpoint generically, nothing family-specific.
    stage = StageSpec(id=0, name="llm", kind="ar", output="text", final_output=True)
    return PipelineSpec(name=name, stages=(stage,))


QWEN2 = text_llm("qwen2")

register_pipeline("qwen2", QWEN2, deploy_config="qwen2_llm.yaml")
register_pipeline("Qwen2ForCausalLM", QWEN2, deploy_config="qwen2_llm.yaml")
register_pipeline("*ForCausalLM", text_llm("text_llm"), deploy_config="llm.yaml")
