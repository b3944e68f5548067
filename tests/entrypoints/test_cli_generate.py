"""`omnistage generate`: one offline run written to a file, with a progress bar."""

from __future__ import annotations

import pytest
from PIL import Image

from omnistage.entrypoints.cli import main


def test_unknown_output_extension_is_an_error(tmp_path, capsys):
    assert main(["generate", str(tmp_path), "--prompt", "x", "--output", str(tmp_path / "out.gif")]) == 2
    assert "unknown extension" in capsys.readouterr().err


@pytest.mark.slow
def test_generate_images_and_reject_a_mismatched_output(zoo, tmp_path, capsys):
    model = str(zoo("z-image"))
    out = tmp_path / "fox.png"
    code = main(["generate", model, "--prompt", "a red fox", "--size", "64x32", "--steps", "2", "--n", "2",
                 "--seed", "1", "--output", str(out)])
    assert code == 0
    assert Image.open(out).size == (64, 32) and (tmp_path / "fox-1.png").exists()
    captured = capsys.readouterr()
    assert "2/2" in captured.err  # the progress bar reached the last step

    assert main(["generate", model, "--prompt", "x", "--output", str(tmp_path / "x.wav")]) == 2
    assert "makes image, not audio" in capsys.readouterr().err


@pytest.mark.slow
def test_generate_speech_with_stage_overrides(zoo, tmp_path):
    import soundfile as sf

    out = tmp_path / "hello.wav"
    code = main(["generate", str(zoo("csm")), "--prompt", "Hello there.", "--voice", "alloy", "--output", str(out),
                 "--stage-overrides", '{"0": {"default_sampling_params": {"max_tokens": 8}}}'])
    assert code == 0
    audio, rate = sf.read(out)
    assert rate == 24000 and len(audio) > 0
