"""The speech table (README.md, docs/reference/support.md, `omnistage models --speech`) is read
from each family's `declare_speech`; here every declaration is checked against the family's
spec resolved from its zoo checkpoints: the route it speaks through is the one the server
opens for it, and its preset, designed and cloned voices are the request extras it takes."""

from __future__ import annotations

import pytest

from omnistage.config.registry import REGISTRY, resolve_pipeline
from omnistage.entrypoints.cli import main
from omnistage.entrypoints.openai.capabilities import Capabilities
from omnistage.models import speech_support

# Every family that speaks -> its zoo checkpoints (Qwen3-TTS: one per task).
ZOO = {
    "csm": ("csm",), "higgs_audio_v2": ("higgs-audio-v2",), "voxcpm2": ("voxcpm2",), "moss_tts_delay": ("moss-tts",),
    "OmniVoice": ("omnivoice",), "dual_ar": ("fish-speech",), "moshi": ("moshi",), "qwen2_5_omni": ("qwen2.5-omni",),
    "qwen3_omni_moe": ("qwen3-omni",),
    "qwen3_tts": ("qwen3-tts-custom-voice", "qwen3-tts-voice-design", "qwen3-tts-base"),
}


def _route(caps: Capabilities) -> str | None:
    for route, task in (("duplex", "realtime"), ("speech", "audio.speech"), ("chat", "chat.audio")):
        if caps.serves(task) and (route != "duplex" or caps.duplex):
            return route
    return None


def test_every_family_that_speaks_declares_it():
    declared = speech_support.declared()
    assert set(declared) == set(ZOO)
    for key in REGISTRY.keys():  # families with one spec: it makes speech iff it is declared under a key
        spec = REGISTRY.spec_of(key)
        if spec is not None and _route(Capabilities.from_spec(key, spec)) is not None:
            assert any(REGISTRY.spec_of(k) is spec for k in declared), key


@pytest.mark.parametrize("key", sorted(ZOO))
def test_a_declaration_says_what_the_resolved_family_serves(zoo, key):
    support = speech_support.declared()[key]
    specs = []
    for name in ZOO[key]:
        found = resolve_pipeline(zoo(name))
        assert found.key == key, name
        specs.append(found.spec)
        assert _route(Capabilities.from_spec(key, found.spec)) == support.route, name
    extras = [spec.request_extras for spec in specs]
    if support.route == "speech":  # what the speech route's voice store and prompt read
        assert bool(support.preset) == any(e.get("voice") is not None and e["voice"].choices for e in extras)
        assert bool(support.cloned) == any("ref_audio" in e for e in extras)
    assert not support.designed or any("instructions" in e for e in extras)


def test_the_cli_prints_the_docs_table(capsys):
    assert main(["models", "--speech", "--markdown"]) == 0
    table = capsys.readouterr().out
    assert table == speech_support.markdown(speech_support.rows()) + "\n"
    assert "| Qwen3-TTS | speech | CustomVoice checkpoints" in table
