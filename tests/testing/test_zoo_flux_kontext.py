"""The FLUX.1-Kontext zoo checkpoint: FLUX.1-dev's tiny components saved as a Kontext pipeline
(the same weights as the flux zoo model), registered at both sizes, built deterministically."""

from __future__ import annotations

import hashlib
import json

from omnistage.testing import build, get_model


def digests(folder):  # `.complete` is the cache's own marker (zoo.ensure), not part of a build
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name != ".complete"}


def test_registered_with_both_sizes_and_an_edit_call():
    model = get_model("flux-kontext")
    assert model.sizes == ("tiny", "small") and model.reference_class == "diffusers.FluxKontextPipeline"
    call = model.call_kwargs
    assert call["max_area"] == call["height"] * call["width"]  # diffusers then keeps the asked size


def test_folder_is_flux_dev_saved_as_kontext(zoo):
    kontext, flux = digests(zoo("flux-kontext")), digests(zoo("flux"))
    assert json.loads((zoo("flux-kontext") / "model_index.json").read_text())["_class_name"] == "FluxKontextPipeline"
    assert {k: v for k, v in kontext.items() if k != "model_index.json"} == \
           {k: v for k, v in flux.items() if k != "model_index.json"}


def test_build_is_deterministic(zoo, tmp_path):
    assert digests(zoo("flux-kontext")) == digests(build("flux-kontext", tmp_path / "b"))
