"""`prepack_linears` on a diffusion stage (diffusion/accel/prepack.py), on the tiny Z-Image zoo model:
on CPU the transformer blocks' linears are oneDNN prepacked ones and the output stays within the
parity tolerance of the unpacked run; LoRA and quantized stages, and `prepack_linears: false`, keep
torch's layers; Ulysses and ring leave packing on."""

from __future__ import annotations

import pytest
import torch
from parity import BATCH_SEEDS, TOLERANCE, max_abs_diff, request_for, run_arrays

from omnistage.config.deploy_fields import StageDeployConfig
from omnistage.core.cpu_linear import PrepackedLinear, packable_dtypes
from omnistage.core.weights import Dropped, checkpoint_names, load_weights, read_checkpoint
from omnistage.diffusion.accel import prepack
from omnistage.diffusion.registry import pipeline_class
from omnistage.models.z_image.pipeline import ZImage
from omnistage.testing import call_kwargs

pytestmark = pytest.mark.skipif(torch.float32 not in packable_dtypes(), reason="this torch has no oneDNN packed ops")


def packed_and_plain(model: torch.nn.Module) -> tuple[list[str], list[str]]:
    """Names of the transformer's packed linears and of its plain ones."""
    modules = dict(model.named_modules())
    return ([n for n, m in modules.items() if isinstance(m, PrepackedLinear)],
            [n for n, m in modules.items() if type(m) is torch.nn.Linear])


@pytest.fixture(scope="module")
def path(zoo):
    return zoo("z-image")


def draw(pipeline, name: str = "z-image") -> list:
    return run_arrays(pipeline, [request_for(call_kwargs(name), BATCH_SEEDS[0])])


PACKED = StageDeployConfig(prepack_linears=True)


def test_blocks_are_packed_and_the_image_stays_within_parity_tolerance(path):
    packed = ZImage.from_pretrained(path, deploy=PACKED)
    plain = ZImage.from_pretrained(path)  # the default: a diffusion stage stays unpacked
    names, left = packed_and_plain(packed.transformer)
    in_blocks = ("layers.", "noise_refiner.", "context_refiner.")  # its repeated ZImageTransformerBlocks
    assert names and all(n.startswith(in_blocks) for n in names)  # every packed layer is a block's,
    assert left and not [n for n in left if n.startswith(in_blocks)]  # every block's is packed
    assert "t_embedder.mlp.0" in left  # and the glue is as loaded: its timestep embedder reads this one's weight
    assert packed_and_plain(plain.transformer)[0] == []
    got, expected = draw(packed), draw(plain)
    assert max_abs_diff(got[0], expected[0]) <= TOLERANCE


@pytest.mark.parametrize("deploy", [dict(quantization="int8_dynamic"), dict(max_loras=1)], ids=["quantization", "lora"])
def test_quantized_and_lora_stages_are_left_unpacked(path, deploy):
    pipeline = ZImage.from_pretrained(path, deploy=StageDeployConfig(prepack_linears=True, **deploy))
    assert packed_and_plain(pipeline.transformer)[0] == []


@pytest.mark.parametrize("field", sorted(prepack.LEFT_UNPACKED_WITH))
def test_every_field_that_touches_the_linears_turns_packing_off(field):
    values = dict(lora=({"path": "x"},), lora_adapters={"a": "x"}, max_loras=1, quantization="int8",
                  transformer_file="x.gguf", tensor_parallel_size=2, fsdp_degree=2, offload="model", compile=True)
    two_ranks = field in ("tensor_parallel_size", "fsdp_degree")
    devices = dict(num_devices=2, devices=("cpu", "cpu"), executor="mp") if two_ranks else {}
    assert prepack.from_deploy(StageDeployConfig(devices=("cpu",), prepack_linears=True)) is not None
    assert prepack.from_deploy(StageDeployConfig(**{"devices": ("cpu",), field: values[field], **devices},
                                                 prepack_linears=True)) is None


def test_sequence_parallel_keeps_packing_on():
    two_ranks = dict(devices=("cpu", "cpu"), num_devices=2, executor="mp")
    assert prepack.from_deploy(StageDeployConfig(**two_ranks, ulysses_degree=2, prepack_linears=True)) is not None
    assert prepack.from_deploy(StageDeployConfig(**two_ranks, ring_degree=2, prepack_linears=True)) is not None


def test_a_diffusion_stage_is_unpacked_by_default():
    """Packed blocks change a request's image by rounding with its batch: the default keeps each
    request's image independent of what it is batched with (tests/api/test_real_models.py)."""
    assert prepack.from_deploy(StageDeployConfig(devices=("cpu",))) is None


def test_weight_updates_and_sleep_level_2_reach_the_packed_layers(zoo):
    """On Qwen-Image (its feed-forwards are diffusers GELUs, whose linear is packed under its own name):
    seed 1's transformer weights loaded into seed 0's packed pipeline draw, within the parity tolerance,
    what they draw loaded into an unpacked one; sleep level 2's drop and read-back draw it again."""
    qwen_image = pipeline_class("QwenImagePipeline")
    old, new = zoo("qwen-image"), zoo("qwen-image", seed=1)
    packed = qwen_image.from_pretrained(old, deploy=PACKED)
    plain = qwen_image.from_pretrained(old)
    assert isinstance(packed.transformer.transformer_blocks[0].img_mlp.net[0].proj, PrepackedLinear)
    before = draw(packed, "qwen-image")[0]
    tensors = read_checkpoint(new, ["transformer"])
    for pipeline in (packed, plain):
        load_weights({"transformer": pipeline.transformer}, tensors)
    after = draw(packed, "qwen-image")[0]
    assert max_abs_diff(after, before) > 0.01  # the seeds draw differently
    assert max_abs_diff(after, draw(plain, "qwen-image")[0]) <= TOLERANCE
    modules = {"transformer": packed.transformer}
    dropped = Dropped(modules, checkpoint_names(new, modules))
    dropped.restore(modules, read_checkpoint(new, modules))
    assert max_abs_diff(draw(packed, "qwen-image")[0], after) <= TOLERANCE  # runs differ in the last bits
