"""`omnistage generate MODEL --prompt ... --output out.png|out.mp4|out.wav`: one offline run.

The output's extension says what to write: an image (.png .jpg .jpeg .webp; with
`--n` > 1, `out-1.png`, ... after the first), a video (.mp4), audio (.wav .flac .mp3
.pcm .opus) or text (.txt). Text is also printed. A progress bar follows the request:
denoising steps for diffusion stages, tokens and audio chunks otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

IMAGE_SUFFIXES = {".png": "png", ".jpg": "jpeg", ".jpeg": "jpeg", ".webp": "webp"}
AUDIO_SUFFIXES = {".wav": "wav", ".flac": "flac", ".mp3": "mp3", ".pcm": "pcm", ".opus": "opus"}


def register(subparsers) -> None:
    p = subparsers.add_parser("generate", help="run one request offline and write the result to a file")
    p.add_argument("model", help="model folder or hub id")
    p.add_argument("--prompt", required=True)
    p.add_argument("--output", "-o", required=True, help="out.png | out.mp4 | out.wav | out.txt ...")
    p.add_argument("--image", action="append", default=[], help="input image (edit, image-to-video); repeatable")
    p.add_argument("--control-video", default=None, help="Wan-VACE: a control video (num_frames frames of --size)")
    p.add_argument("--mask-video", default=None, help="Wan-VACE: the control video's mask (white: generate)")
    p.add_argument("--negative-prompt", default=None)
    p.add_argument("--size", default=None, help="WIDTHxHEIGHT")
    p.add_argument("--n", type=int, default=1, help="images to generate")
    p.add_argument("--steps", type=int, default=None, help="denoising steps")
    p.add_argument("--guidance-scale", type=float, default=None)
    p.add_argument("--true-cfg-scale", type=float, default=None)
    p.add_argument("--num-frames", type=int, default=None)
    p.add_argument("--fps", type=float, default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--extras", default=None, help='model extras as JSON, e.g. \'{"max_sequence_length": 64}\'')
    p.add_argument("--max-tokens", type=int, default=None, help="AR stages: most tokens to generate")
    p.add_argument("--temperature", type=float, default=None)
    p.add_argument("--voice", default=None, help="speech models: the voice")
    p.add_argument("--deploy-config", default=None)
    p.add_argument("--stage-overrides", default=None)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    output = Path(args.output)
    kind = _output_kind(output)
    if kind is None:
        known = sorted([*IMAGE_SUFFIXES, ".mp4", *AUDIO_SUFFIXES, ".txt"])
        print(f"error: --output {output}: unknown extension; use one of {' '.join(known)}", file=sys.stderr)
        return 2
    from omnistage.entrypoints.omni import AsyncOmni

    omni = None
    try:
        omni = AsyncOmni(args.model, deploy_config=args.deploy_config, stage_overrides=args.stage_overrides)
        outputs = {m for stage in omni.spec.final_stages for m in stage.modalities}
        if kind not in outputs:
            raise ValueError(f"--output {output}: model {args.model} makes {' and '.join(sorted(outputs))}, "
                             f"not {kind}")
        prompt, params = build_request(args, omni)
        out = asyncio.run(_generate(omni, prompt, params))
        if out.error:
            print(f"error: {out.error}", file=sys.stderr)
            return 1
        for path in write_output(out, output, kind):
            print(f"[omnistage] wrote {path}")
        if out.text and kind != "text":
            print(out.text)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    finally:
        if omni is not None:
            omni.close()
    return 0


def _output_kind(path: Path) -> str | None:
    suffix = path.suffix.lower()
    if suffix in IMAGE_SUFFIXES:
        return "image"
    if suffix == ".mp4":
        return "video"
    if suffix in AUDIO_SUFFIXES:
        return "audio"
    return "text" if suffix == ".txt" else None


def video_frames(path: str) -> list[Any]:
    """A video file's frames as RGB PIL images."""
    from PIL import Image

    from omnistage.media.video import decode_video

    frames, _ = decode_video(Path(path).read_bytes())
    return [Image.fromarray(frame) for frame in frames]


def build_request(args: argparse.Namespace, omni: Any) -> tuple[Any, Any]:
    """The prompt and params for the pipeline's entry stage (ValueError on bad flags)."""
    import json

    spec = omni.spec
    entry = spec.entry_stages[0]
    if entry.kind == "diffusion":
        from omnistage.diffusion.params import DiffusionParams
        from omnistage.media.image import decode_image

        width = height = None
        if args.size:
            try:
                width, height = (int(v) for v in args.size.lower().split("x"))
            except ValueError:
                raise ValueError(f"--size: expected WIDTHxHEIGHT, got {args.size!r}") from None
        extras = json.loads(args.extras) if args.extras else {}
        params = DiffusionParams(
            negative_prompt=args.negative_prompt, width=width, height=height, num_frames=args.num_frames,
            fps=args.fps, num_inference_steps=args.steps, guidance_scale=args.guidance_scale,
            true_cfg_scale=args.true_cfg_scale, seed=args.seed, num_outputs_per_prompt=args.n, extras=extras)
        images = [decode_image(Path(p).read_bytes(), field=p) for p in args.image]
        media = {key: video_frames(path) for key, path in (("video", args.control_video), ("mask", args.mask_video))
                 if path is not None}
        if images:
            media["image"] = images if len(images) > 1 else images[0]
        return ({"prompt": args.prompt, **media} if media else args.prompt), params
    for flag, value in (("--image", args.image), ("--control-video", args.control_video),
                        ("--mask-video", args.mask_video)):
        if value:
            raise ValueError(f"{flag}: this model's first stage is not a diffusion stage")
    from omnistage.ar.sampling_params import SamplingParams

    values = {k: v for k, v in (("max_tokens", args.max_tokens), ("temperature", args.temperature),
                                ("seed", args.seed)) if v is not None}
    params = None  # the stages' deploy defaults
    if values and entry.kind == "ar":  # the engine fills the fields not given from the deploy defaults
        params = {entry.name: SamplingParams.from_dict(values)}
    makes_text = any("text" in s.modalities for s in spec.final_stages)
    if makes_text:
        return {"messages": [{"role": "user", "content": args.prompt}]}, params
    prompt = {"prompt": args.prompt}  # speech models: the text to say
    if args.voice:
        prompt["voice"] = args.voice
    return prompt, params


async def _generate(omni: Any, prompt: Any, params: Any) -> Any:
    from tqdm.auto import tqdm

    bar = tqdm(desc="generating", unit="step", dynamic_ncols=True)
    last = None
    try:
        async for out in omni.generate(prompt, params):
            if out.progress is not None:
                bar.total = out.progress.num_steps
                bar.set_description(f"{out.stage or 'denoising'}")
                bar.n = out.progress.step
                bar.refresh()
            elif out.text_delta or out.audio_chunk is not None:
                bar.unit = "chunk"
                bar.update(1)
            last = out
    finally:
        bar.close()
    return last


def write_output(out: Any, path: Path, kind: str) -> list[Path]:
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "image":
        from omnistage.media.image import encode_image

        images = out.images or []
        if not images:
            raise ValueError("the model returned no image")
        paths = [path] + [path.with_name(f"{path.stem}-{i}{path.suffix}") for i in range(1, len(images))]
        for image, p in zip(images, paths):
            p.write_bytes(encode_image(image, IMAGE_SUFFIXES[path.suffix.lower()]))
        return paths
    if kind == "video":
        from omnistage.media.video import encode_mp4

        if out.video is None:
            raise ValueError("the model returned no video")
        path.write_bytes(encode_mp4(out.video, out.fps, audio=out.audio, sample_rate=out.sample_rate))
        return [path]
    if kind == "audio":
        from omnistage.media.audio import encode_audio

        if out.audio is None:
            raise ValueError("the model returned no audio")
        path.write_bytes(encode_audio(out.audio, out.sample_rate, AUDIO_SUFFIXES[path.suffix.lower()]))
        return [path]
    path.write_text(out.text or "")
    return [path]
