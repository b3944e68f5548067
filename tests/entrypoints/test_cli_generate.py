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


def test_a_control_video_and_its_mask_travel_as_frames(tmp_path):
    # The request `generate` builds (no model loaded): the files' frames as PIL images.
    from types import SimpleNamespace

    import numpy as np

    from omnistage.entrypoints.commands.generate import build_request
    from omnistage.media.video import encode_mp4
    from omnistage.models.wan import WAN_VACE

    for name in ("control", "mask"):
        (tmp_path / f"{name}.mp4").write_bytes(encode_mp4(np.full((5, 32, 32, 3), 128, np.uint8), 8.0))
    args = SimpleNamespace(prompt="grey", size="32x32", extras=None, negative_prompt=None, num_frames=5, fps=8.0,
                           steps=2, guidance_scale=None, true_cfg_scale=None, seed=1, n=1, image=[],
                           control_video=str(tmp_path / "control.mp4"), mask_video=str(tmp_path / "mask.mp4"))
    prompt, params = build_request(args, SimpleNamespace(spec=WAN_VACE))
    assert set(prompt) == {"prompt", "video", "mask"} and params.num_frames == 5
    assert [f.size for f in prompt["video"]] == [(32, 32)] * 5 and isinstance(prompt["mask"][0], Image.Image)
