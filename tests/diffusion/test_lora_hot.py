"""LoRA adapters loaded by path while the stage serves (deploy `max_loras`), on a DiffusionEngine
over the zoo's Z-Image with the zoo's tiny LoRA files: a request's `lora: {name, path}` gives the
image the same adapter declared at start-up gives; requests with different adapters in one
running batch each get their own; the set holds at most `max_loras`, unloads the least recently
used one no request uses, and a request that finds every slot in use waits; a bad file is a
RequestError naming `lora.path` that loads nothing; with `max_loras: 0` a path is refused."""

from __future__ import annotations

import numpy as np
import pytest

from omnistage.config.deploy_fields import StageDeployConfig
from omnistage.core.errors import RequestError
from omnistage.core.types import StageRequest
from omnistage.diffusion.engine import DiffusionEngine
from omnistage.diffusion.params import LoraRequest
from omnistage.testing.lora import build_lora

from test_engine_z_image import assert_same_image, pixels, req, run

NAMES = ("style", "other", "third")


@pytest.fixture(scope="module")
def path(zoo):
    return zoo("z-image")


@pytest.fixture(scope="module")
def loras(path, tmp_path_factory):
    out = tmp_path_factory.mktemp("lora")
    return {name: str(build_lora(path, out / f"{name}.safetensors", seed=seed)) for seed, name in enumerate(NAMES, 1)}


def lora_req(rid: str, lora: LoraRequest | None, seed: int = 0) -> StageRequest:
    base = req(rid, "a cat", seed=seed, steps=2)
    return StageRequest(rid, base.inputs, base.params.model_copy(update={"lora": lora}))


@pytest.fixture(scope="module")
def declared(path, loras):
    """Each adapter's image (and the base model's) from an engine that declares them at start-up;
    the engine stays for the feature-off checks (max_loras: 0)."""
    engine = DiffusionEngine(path, config=StageDeployConfig(lora_adapters=loras))
    images = {}
    for name in (*NAMES, None):
        engine.add_request(lora_req("r", None if name is None else LoraRequest(name=name)))
        images[name] = pixels(run(engine)["r"][-1])
    yield engine, images
    engine.close()


@pytest.fixture(scope="module")
def hot(path):
    engine = DiffusionEngine(path, config=StageDeployConfig(max_loras=2, step_execution=True, max_num_seqs=4))
    yield engine
    engine.close()


def peft_adapters(engine: DiffusionEngine) -> set[str]:
    """The adapters the worker's transformer really holds."""
    return set(getattr(engine.executor.worker.runner.pipeline.transformer, "peft_config", {}))


def test_concurrent_requests_by_path_each_get_their_adapter(hot, declared, loras):
    _, want = declared
    # One running batch (step mode): two adapters loaded by path on first use, one request without.
    for rid, name in (("a", "style"), ("b", "other"), ("c", None)):
        hot.add_request(lora_req(rid, None if name is None else LoraRequest(name=name, path=loras[name])))
    outs = run(hot)
    assert all(out.metrics["batch_size"] == 3 for out in (outs[rid][-1] for rid in "abc"))
    assert_same_image(pixels(outs["a"][-1]), want["style"])
    assert_same_image(pixels(outs["b"][-1]), want["other"])
    assert_same_image(pixels(outs["c"][-1]), want[None])
    assert np.abs(want["style"] - want[None]).max() > 0 and np.abs(want["style"] - want["other"]).max() > 0
    assert [a["name"] for a in hot.list_lora_adapters() if a["loaded"]] == ["other", "style"]


def test_lru_unloads_the_coldest_adapter_no_request_uses(hot, declared, loras):
    _, want = declared
    for name in ("other", "style"):  # the POST route's call: "style" is now the most recently used
        hot.load_lora_adapter(name, loras[name])
    hot.add_request(lora_req("t", LoraRequest(name="third", path=loras["third"])))
    assert list(hot.loras.loaded) == ["style", "third"] and peft_adapters(hot) == {"style", "third"}
    run(hot)
    # "other" was unloaded, not forgotten: by name alone it loads again, in place of "style".
    hot.add_request(lora_req("o", LoraRequest(name="other")))
    assert list(hot.loras.loaded) == ["third", "other"] and peft_adapters(hot) == {"third", "other"}
    assert_same_image(pixels(run(hot)["o"][-1]), want["other"])

    # Both slots hold adapters of queued requests: a third adapter waits instead of evicting one.
    hot.add_request(lora_req("x", LoraRequest(name="third")))
    hot.add_request(lora_req("y", LoraRequest(name="other")))
    hot.add_request(lora_req("z", LoraRequest(name="style")))
    assert list(hot.loras.loaded) == ["third", "other"] and hot.has_unfinished_requests()
    outs = run(hot)
    assert_same_image(pixels(outs["x"][-1]), want["third"])
    assert_same_image(pixels(outs["y"][-1]), want["other"])
    assert_same_image(pixels(outs["z"][-1]), want["style"])

    hot.unload_lora_adapter("style")  # the DELETE route's call
    assert "style" not in peft_adapters(hot) and "style" not in hot.loras.names()
    with pytest.raises(RequestError, match="unknown adapter 'style'") as info:
        hot.add_request(lora_req("s", LoraRequest(name="style")))
    assert info.value.param == "lora.name"


def test_bad_file_is_refused_naming_lora_path_and_loads_nothing(hot, declared, zoo, tmp_path):
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_text("not a safetensors file")
    bad = {
        "missing": (str(tmp_path / "missing.safetensors"), "no LoRA file"),
        "garbage": (str(garbage), "cannot load adapter 'garbage'"),
        # LoRAs for other models: shapes that do not match, modules Z-Image does not have
        "small": (str(build_lora(zoo("z-image", size="small"), tmp_path / "small.safetensors")), "size mismatch"),
        "flux": (str(build_lora(zoo("flux"), tmp_path / "flux.safetensors")), "not found in the base model"),
    }
    before, held = hot.list_lora_adapters(), peft_adapters(hot)
    for name, (file, why) in bad.items():
        with pytest.raises(RequestError, match=why) as info:
            hot.add_request(lora_req(name, LoraRequest(name=name, path=file)))
        assert info.value.param == "lora.path"
        with pytest.raises(RequestError, match=why) as info:
            hot.load_lora_adapter(name, file)
        assert info.value.param == "path"
    assert hot.list_lora_adapters() == before and peft_adapters(hot) == held
    assert not hot.has_unfinished_requests()

    # Feature off (max_loras: 0): a path is refused before anything is read.
    engine, _ = declared
    with pytest.raises(RequestError, match=r"loads no adapter by path \(deploy max_loras: 0\)") as info:
        engine.add_request(lora_req("p", LoraRequest(name="new", path=bad["small"][0])))
    assert info.value.param == "lora.path"
