"""The default engine factory refuses deploy fields that nothing implements yet, and a diffusion
family the acceleration fields it does not declare."""

import pytest

from omnistage.config.deploy_fields import StageDeployConfig
from omnistage.config.spec import StageSpec
from omnistage.engine.factory import check_implemented, create_engine

DIFFUSION = StageSpec(id=0, name="diffusion", kind="diffusion", output="image", final_output=True)
LLM = StageSpec(id=0, name="llm", kind="ar", output="text", final_output=True)
VOCODER = StageSpec(id=0, name="vocoder", kind="generation", output="audio", final_output=True)


def test_a_diffusion_family_without_a_tensor_parallel_plan_is_refused_before_loading(zoo):
    config = StageDeployConfig(executor="mp", num_devices=2, tensor_parallel_size=2)
    with pytest.raises(ValueError, match=r"stage 0 \(diffusion\): tensor_parallel_size=2: "
                                         r"StableDiffusionXLPipeline cannot take it \(it takes: .*\)"):
        create_engine(str(zoo("sdxl")), DIFFUSION, config)


def test_an_unknown_cache_backend_is_refused_before_loading():
    with pytest.raises(ValueError, match=r"stage 0 \(diffusion\): cache_backend must be one of .*got 'tea'"):
        create_engine("/does/not/exist", DIFFUSION, StageDeployConfig(cache_backend="tea"))


def test_defaults_pass_and_ar_backends_implement_their_own_fields():
    check_implemented(DIFFUSION, StageDeployConfig())
    check_implemented(LLM, StageDeployConfig(ar_backend="vllm", compile=True))
    check_implemented(LLM, StageDeployConfig(compile=True))  # native: CUDA graphs (ar/cuda_graphs.py)
    with pytest.raises(ValueError, match="compile=True"):
        check_implemented(VOCODER, StageDeployConfig(compile=True))


@pytest.mark.parametrize("fields, named", [
    ({"lora": ({"path": "/x.safetensors"},)}, "lora="),
    ({"offload": "model"}, "offload='model'"),
])
def test_ar_stages_refuse_lora_and_offload_by_name(fields, named):
    with pytest.raises(ValueError, match=r"stage 0 \(llm\): .*is not implemented by the native AR engine") as info:
        create_engine("/does/not/exist", LLM, StageDeployConfig(**fields))
    assert named in str(info.value)


def test_native_ar_takes_quantization_and_the_others_refuse_it():
    """The native AR engine quantizes its LLM (tests/ar/test_ar_quantization.py); vLLM and the
    generation engine do not."""
    check_implemented(LLM, StageDeployConfig(quantization="int8", ignored_layers=("lm_head",)))
    with pytest.raises(ValueError, match=r"quantization='int8'.*is not implemented by the vllm AR engine"):
        check_implemented(LLM, StageDeployConfig(ar_backend="vllm", quantization="int8"))
    with pytest.raises(ValueError, match=r"quantization='int8'.*is not implemented by the generation engine"):
        check_implemented(VOCODER, StageDeployConfig(quantization="int8"))
    check_implemented(LLM, StageDeployConfig(lora_adapters={"a": "/a"}, max_loras=2))  # tests/ar/test_ar_lora.py
    with pytest.raises(ValueError, match=r"max_loras=2.*is not implemented by the vllm AR engine"):
        check_implemented(LLM, StageDeployConfig(ar_backend="vllm", max_loras=2))
