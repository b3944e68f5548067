"""Diffusion engine throughput and latency vs diffusers' own pipelines, in one script.

8 requests (8 prompts, seeds 0-7), the zoo's default call for each family (4 steps,
CFG on, 64x64 on tiny, 256x256 on small), on the zoo's z-image and qwen-image, fp32 on CPU
unless `--device` / `--dtype` say otherwise (both sides always share them):

- ours: `DiffusionEngine` request mode, max_num_seqs=8, all 8 submitted at once;
- sequential: the diffusers pipeline called 8 times, one prompt and generator each;
- batched: one diffusers call with the 8 prompts and 8 generators (the fixed-batch ceiling;
  not run for Qwen-Image-Edit-Plus, whose diffusers pipeline takes one prompt per call);
- staggered arrivals (request i arrives at i * gap, gap = a quarter of one request's
  latency): mean latency of step mode (requests join between steps) against request
  mode (a batch runs to the end before the next one starts), both max_num_seqs=8.

Audio families (`stable-audio`) run the same five configurations on the zoo's audio call
(4 steps, CFG on, the model's whole window: 1.024 s tiny, 4.096 s small) and report audio
seconds made per wall-clock second, under "## Diffusion: audio".

Each is warmed up once, then timed `--repeats` times interleaved in one process; the best
run (and the best mean latency) counts. Peak RSS per configuration comes from a separate short process per
configuration (load + one run), sampled with psutil. Prints markdown tables and writes
them under "## Diffusion" in benchmarks/RESULTS.md (other sections are kept).

    .venv/bin/python benchmarks/bench_diffusion.py [--models z-image qwen-image] [--sizes tiny small]

Video families (`--models hunyuan-video cosmos3 sana-wm`) get their own table, "## Diffusion:
video": ours against the diffusers pipeline called once per request (see `bench_video`).
Also: --models qwen-image-edit-plus (each request edits two input images), joyai-image-edit-plus,
qwen-image-2.1 and ltx2-two-stage (printed only: see `bench_two_stage`);
Edit families (flux-kontext, joyai-image-edit, longcat-image-edit, qwen-image-layered: one input
image a request) and video families outside VIDEO_MODELS (wan-t2v, wan-i2v, wan-vace, sana-video,
sana-video-i2v, kandinsky6; videos/s in the img/s columns) run the image table's configurations;
--omni runs "ours" of every family through `Omni.generate` (the product path: orchestrator and
output conversion included) instead of a bare `DiffusionEngine`, with no staggered rows;
--one-prompt gives all 8 requests the first prompt (seeds still 0-7): Qwen-Image 2.1 batches
only prompts of one token length in a transformer call.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch

from common import add_device_args, synchronize, torch_dtype, write_section

ROOT = Path(__file__).resolve().parent.parent
NUM_REQUESTS = 8
PROMPTS = [
    "a cat",
    "a photo of a small dog sitting on a long red wooden chair",
    "a tree in the snow at night",
    "an astronaut riding a horse on the moon, highly detailed",
    "a bowl of fruit",
    "a watercolor painting of a mountain lake at sunrise with mist over the water",
    "a red bicycle",
    "a lighthouse on a rocky coast during a storm",
]
CONFIGS = ("ours", "sequential", "batched", "step_staggered", "request_staggered")
AUDIO_MODELS = ("stable-audio",)
# Families whose diffusers pipeline takes one prompt per call: no "batched" run.
ONE_PROMPT_PER_CALL = {"qwen-image-edit-plus", "longcat-image-edit", "wan-vace"}
# Input images of each request, for families that edit (two each: Edit-Plus takes 1-3).
INPUT_IMAGES = {"qwen-image-edit-plus": 2, "joyai-image-edit-plus": 2, "flux-kontext": 1, "joyai-image-edit": 1,
                "longcat-image-edit": 1, "qwen-image-layered": 1}
# Families whose input image is RGBA (Qwen-Image-Layered decomposes it into RGBA layers).
RGBA_INPUT = {"qwen-image-layered"}
# Families run with their references' buckets shrunk to each image's own size, both sides, as in
# the tests (omnistage.testing.joyimage_models.small_buckets): a ~1-megapixel reference's VAE
# encode would be nearly all of a tiny model's time.
SMALL_BUCKETS = {"joyai-image-edit-plus", "joyai-image-edit"}
# Families whose diffusers call takes no output size (about a megapixel from the input image's
# aspect ratio, by the module's `calculate_dimensions`, which ours reads too): both sides are
# told the zoo's side at the bench size through that one function, as in the parity tests.
SIZED_BY_INPUT = {"longcat-image-edit": "diffusers.pipelines.longcat_image.pipeline_longcat_image_edit",
                  "qwen-image-layered": "diffusers.pipelines.qwenimage.pipeline_qwenimage_layered"}
# Families whose diffusers call rescales the asked size to (default_sample_size * VAE factor)**2, 1024**2
# (HiDream-I1); ours generates the asked size.
RESCALED_TO_DEFAULT_AREA = {"hidream-image"}
# Families that animate one input image (its first frame).
FIRST_FRAME = {"sana-wm", "wan-i2v", "sana-video-i2v"}


# -- inputs ------------------------------------------------------------------------------


OMNI_MODELS = ["glm-image"]
"""Families whose "ours" runs through `Omni.generate` (the product path): pipelines of more than
one stage (GLM-Image: AR prior -> DiT, both stages batching), and every family with `--omni`;
the staggered rows are left out for them."""


def call_kwargs(model: str, size: str) -> dict:
    """The zoo's call for `model` at `size` (omnistage.testing.call_kwargs), less the prompt."""
    from omnistage.testing import call_kwargs as zoo_call_kwargs
    from omnistage.testing.diffusion_models import default_input_image

    kwargs = zoo_call_kwargs(model, size)
    kwargs.pop("prompt")
    kwargs.pop("audio_end_in_s", None)  # audio: the model's whole window
    if "num_frames" in kwargs or "frames" in kwargs:  # video (SANA-Video: `frames`): compared as uint8 frames
        kwargs["output_type"] = "np"
    if "max_area" in kwargs:  # FLUX.1-Kontext: diffusers' output area, the asked size's at every size
        kwargs["max_area"] = kwargs["height"] * kwargs["width"]
    if model in FIRST_FRAME:
        kwargs["image"] = default_input_image(kwargs["height"])
    if model in INPUT_IMAGES:
        from PIL import ImageOps

        images = [default_input_image(), ImageOps.mirror(default_input_image())]
        kwargs["image"] = [i.convert("RGBA") if model in RGBA_INPUT else i for i in images[: INPUT_IMAGES[model]]]
    return kwargs


# diffusers call kwargs named differently in our requests (LTX-2), or not a request field at all.
RENAMED = {"frame_rate": ("fps", lambda v: v), "spatio_temporal_guidance_blocks": ("stg_block", lambda v: v[0]),
           "frames": ("num_frames", lambda v: v),  # SANA-Video
           "output_type": (None, None),
           # FLUX.1-Kontext: diffusers rescales to max_area (we make the size asked for); its resize switch is ours
           "max_area": (None, None), "_auto_resize": ("auto_resize", lambda v: v)}


def reference_loader_kwargs(model: str, path: str) -> dict:
    """What diffusers' loader needs beyond the folder: the Qwen-VL processors transformers
    cannot build without torchvision (omnistage/models/qwen_image/vl_processor.py)."""
    from omnistage.models.qwen_image.vl_processor import processor_from_parts

    if model == "qwen-image-edit-plus":
        from transformers import Qwen2VLProcessor

        return {"processor": processor_from_parts(Qwen2VLProcessor, path)}
    if model in ("qwen-image-2.1", "joyai-image-edit-plus", "joyai-image-edit"):
        from transformers import Qwen3VLProcessor

        return {"processor": processor_from_parts(Qwen3VLProcessor, path)}
    if model in ("longcat-image", "longcat-image-edit"):
        from transformers import Qwen2VLProcessor

        return {"text_processor": processor_from_parts(Qwen2VLProcessor, path, "text_processor")}
    if model == "kandinsky6":  # its Qwen2.5-VL processor built from its halves, as our loader does
        from omnistage.models.kandinsky6.pipeline import Kandinsky6TI2VA

        return Kandinsky6TI2VA.loader_kwargs(path)
    if model == "qwen-image-layered":  # its processor only captions an empty prompt (every request has one)
        return {"processor": None}
    return {}


def stage_requests(kwargs: dict, prefix: str = "r") -> list:
    """The same inputs as `kwargs` + PROMPTS + seeds, as engine requests."""
    from omnistage.core.types import StageRequest
    from omnistage.diffusion.params import DiffusionParams

    renamed = {RENAMED[k][0]: RENAMED[k][1](v) for k, v in kwargs.items() if k in RENAMED and RENAMED[k][0]}
    kwargs = {**{k: v for k, v in kwargs.items() if k not in RENAMED}, **renamed}
    images = kwargs.pop("image", None)
    fields = {k: v for k, v in kwargs.items() if k in DiffusionParams.model_fields}
    extras = {k: v for k, v in kwargs.items() if k not in DiffusionParams.model_fields}
    return [StageRequest(f"{prefix}{i}", prompt if images is None else {"prompt": prompt, "image": images},
                         DiffusionParams(seed=i, extras=extras, **fields))
            for i, prompt in enumerate(PROMPTS)]


def generator(seed: int) -> torch.Generator:
    return torch.Generator("cpu").manual_seed(seed)


# -- the runs ----------------------------------------------------------------------------


def run_ours(engine, kwargs: dict) -> list:
    for request in stage_requests(kwargs):
        engine.add_request(request)
    done = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                assert out.error is None, out.error
                done[out.request_id] = _payload_output(out.payload)
    return [done[f"r{i}"] for i in range(NUM_REQUESTS)]


def _payload_output(payload) -> object:
    """Our result for one request: its video's frames, its waveform [samples, channels], its image, or
    its layers stacked (Qwen-Image-Layered)."""
    if hasattr(payload, "frames"):  # a video (its soundtrack, if any, is not compared here)
        return payload.frames
    if getattr(payload, "video", None) is not None:  # the same, from `Omni.generate`
        return payload.video
    if getattr(payload, "audio", None) is not None:
        return np.asarray(payload.audio)
    images = payload.images  # Qwen-Image-Layered: one image per layer, stacked
    return images[0] if len(images) == 1 else np.stack([np.asarray(i) for i in images])


def _pipe_outputs(out) -> list:
    """diffusers' results, one per prompt: images, one video's uint8 frames, or waveforms as [samples, channels]."""
    if hasattr(out, "audios"):  # AudioPipelineOutput: [channels, samples] tensors
        return [np.asarray(a.cpu()).T for a in out.audios]
    if hasattr(out, "frames"):
        return [(np.clip(frames, 0.0, 1.0) * 255).round().astype(np.uint8) for frames in out.frames]
    # Qwen-Image-Layered: a list of layers per prompt, stacked (its batched call misplaces them
    # beyond one prompt, leaving some lists empty: timed only, never compared)
    return [np.stack([np.asarray(i) for i in image]) if isinstance(image, list) and image else image
            for image in out.images]


def run_omni(omni, kwargs: dict) -> list:
    """All 8 requests through `Omni.generate` at once (every stage of the pipeline)."""
    requests = stage_requests(kwargs)
    outputs = omni.generate([r.inputs for r in requests], [r.params for r in requests], use_tqdm=False)
    return [_payload_output(out) for out in outputs]


def _reference_kwargs(pipe, kwargs: dict, num_prompts: int) -> dict:
    """`kwargs` as the diffusers pipeline takes them (JoyAI-Image-Edit-Plus: `images`, a list per prompt)."""
    if type(pipe).__name__ != "JoyImageEditPlusPipeline" or "image" not in kwargs:
        return kwargs
    kwargs = dict(kwargs)
    images = kwargs.pop("image")
    return {**kwargs, "images": images if num_prompts == 1 else [images] * num_prompts}


def run_sequential(pipe, kwargs: dict) -> list:
    kwargs = _reference_kwargs(pipe, kwargs, 1)
    return [_pipe_outputs(pipe(prompt=p, **kwargs, generator=generator(i)))[0] for i, p in enumerate(PROMPTS)]


def run_batched(pipe, kwargs: dict) -> list:
    kwargs = dict(_reference_kwargs(pipe, kwargs, NUM_REQUESTS))  # a copy: the other runs share `kwargs`
    if kwargs.get("negative_prompt") is not None:  # FLUX.2's pipelines take no negative_prompt
        kwargs["negative_prompt"] = [kwargs["negative_prompt"]] * NUM_REQUESTS
    return _pipe_outputs(pipe(prompt=PROMPTS, **kwargs, generator=[generator(i) for i in range(NUM_REQUESTS)]))


def run_staggered(engine, kwargs: dict, gap: float) -> float:
    """Request i arrives at i * gap; returns the mean latency from arrival to final output."""
    pending = stage_requests(kwargs)
    start, finish = time.perf_counter(), {}
    while pending or engine.has_unfinished_requests():
        now = time.perf_counter() - start
        while pending and int(pending[0].request_id[1:]) * gap <= now:
            engine.add_request(pending.pop(0))
        if engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    finish[int(out.request_id[1:])] = time.perf_counter() - start
        elif pending:
            time.sleep(max(0.0, int(pending[0].request_id[1:]) * gap - now))
    return float(np.mean([finish[i] - i * gap for i in range(NUM_REQUESTS)]))


def load_reference(loader, path: str, dtype: torch.dtype, **kwargs):
    """diffusers' pipeline for the checkpoint (`kwargs` go to its loader). FLUX.2-dev's `tokenizer`
    is a PixtralProcessor, which transformers cannot import without torchvision; its tokenizer,
    all the text path uses, stands in for it."""
    if json.loads((Path(path) / "model_index.json").read_text())["_class_name"] != "Flux2Pipeline":
        return loader.from_pretrained(path, dtype=dtype, **kwargs)
    from transformers import AutoTokenizer

    pipe = loader.from_pretrained(path, dtype=dtype, tokenizer=None, **kwargs)
    return type(pipe)(**dict(pipe.components, tokenizer=AutoTokenizer.from_pretrained(path, subfolder="tokenizer")))


def build(model: str, size: str, configs: tuple[str, ...], device: str = "cpu", dtype: str = "float32") -> dict:
    """What `configs` need: the diffusers pipeline and / or our engines, all on `device` in `dtype`."""
    from diffusers import DiffusionPipeline

    from omnistage.config.deploy_fields import StageDeployConfig
    from omnistage.diffusion.engine import DiffusionEngine
    from omnistage.testing import ensure

    path = str(ensure(model, size=size, cache_dir=ROOT / ".omnistage-cache" / "zoo"))
    built = {"path": path}
    if {"sequential", "batched"} & set(configs):
        pipe = load_reference(DiffusionPipeline, path, torch_dtype(dtype), **reference_loader_kwargs(model, path)).to(device)
        pipe.set_progress_bar_config(disable=True)
        if model in RESCALED_TO_DEFAULT_AREA:  # as the parity test: its area is the asked side's
            from omnistage.testing import get_model

            pipe.default_sample_size = get_model(model).sides[size] // pipe.vae_scale_factor
        built["pipe"] = pipe
    engine_config = dict(max_num_seqs=NUM_REQUESTS, dtype=dtype, devices=(device,))
    if model in OMNI_MODELS:
        from omnistage import Omni

        if "ours" in configs:
            built["omni"] = Omni(path, stage_overrides={"*": engine_config})
        return built
    if {"ours", "request_staggered"} & set(configs):
        built["request"] = DiffusionEngine(path, config=StageDeployConfig(**engine_config))
    if "step_staggered" in configs:
        built["step"] = DiffusionEngine(path, config=StageDeployConfig(**engine_config, step_execution=True))
    return built


def runners(built: dict, kwargs: dict, gap: float) -> dict:
    if "omni" in built:
        return {"ours": lambda: run_omni(built["omni"], kwargs), "sequential": lambda: run_sequential(built["pipe"], kwargs),
                "batched": lambda: run_batched(built["pipe"], kwargs)}
    return {
        "ours": lambda: run_ours(built["request"], kwargs),
        "sequential": lambda: run_sequential(built["pipe"], kwargs),
        "batched": lambda: run_batched(built["pipe"], kwargs),
        "step_staggered": lambda: run_staggered(built["step"], kwargs, gap),
        "request_staggered": lambda: run_staggered(built["request"], kwargs, gap),
    }


def single_latency(engine, kwargs: dict) -> float:
    engine.add_request(stage_requests(kwargs, prefix="warm")[0])
    start = time.perf_counter()
    while engine.has_unfinished_requests():
        engine.step()
    return time.perf_counter() - start


def bench(model: str, size: str, repeats: int, device: str = "cpu", dtype: str = "float32") -> dict:
    if model in SMALL_BUCKETS:
        from omnistage.testing.joyimage_models import small_buckets

        with small_buckets():
            return _bench(model, size, repeats, device, dtype)
    if model in SIZED_BY_INPUT:
        import importlib
        from unittest import mock

        from omnistage.testing import get_model

        side = get_model(model).sides[size]
        with mock.patch.object(importlib.import_module(SIZED_BY_INPUT[model]), "calculate_dimensions",
                               lambda area, ratio: (side, side)):
            return _bench(model, size, repeats, device, dtype)
    return _bench(model, size, repeats, device, dtype)


def _bench(model: str, size: str, repeats: int, device: str = "cpu", dtype: str = "float32") -> dict:
    kwargs = call_kwargs(model, size)
    configs = tuple(c for c in CONFIGS if not (c == "batched" and model in ONE_PROMPT_PER_CALL))
    built = build(model, size, configs, device, dtype)
    # One request's latency alone, warm (the first run pays one-off costs).
    gap = 0.0 if model in OMNI_MODELS else min(single_latency(built["request"], kwargs) for _ in range(3)) / 4
    fns = {name: fn for name, fn in runners(built, kwargs, gap).items() if name in configs}
    best = {name: float("inf") for name in fns}
    best_cpu = dict(best)
    results, latency = {}, {"step_staggered": float("inf"), "request_staggered": float("inf")}
    with torch.inference_mode():
        for name, fn in fns.items():  # warm-up
            results[name] = fn()
        for _ in range(repeats):
            for name, fn in fns.items():
                t0, c0 = time.perf_counter(), time.process_time()
                results[name] = fn()
                synchronize(device)  # outputs are PIL images already; this only makes it explicit
                best[name] = min(best[name], time.perf_counter() - t0)
                best_cpu[name] = min(best_cpu[name], time.process_time() - c0)
                if name in latency:
                    latency[name] = min(latency[name], results[name])
    for key in ("request", "step", "omni"):
        if key in built:
            built[key].close()
    if model in AUDIO_MODELS:  # float waveforms: the largest sample difference
        diff = max(float(np.abs(a - b).max()) for a, b in zip(results["ours"], results["sequential"]))
        audio_seconds = sum(len(a) for a in results["ours"]) / built["pipe"].vae.config.sampling_rate
    else:
        diff = max(int(np.abs(np.asarray(a, np.int16) - np.asarray(b, np.int16)).max())
                   for a, b in zip(results["ours"], results["sequential"]))
        audio_seconds = None
    params = sum(p.numel() for c in built["pipe"].components.values() if isinstance(c, torch.nn.Module)
                 for p in c.parameters())
    return {"model": model, "size": size, "device": device, "dtype": dtype, "params_m": params / 1e6, "secs": best, "cpu_secs": best_cpu,
            "gap": gap, "latency": latency,
            "max_pixel_diff": diff, "audio_seconds": audio_seconds}


# -- LTX-2 two-stage: ours through Omni / diffusers' chained calls ----------------------------

TWO_STAGE_MODELS = ("ltx2-two-stage",)
"""LTX-2's two-stage pipeline on the zoo's ltx2 and ltx2-latent-upsampler: ours is `Omni.generate`
on a pipeline folder naming them (base -> upsampler -> refiner, the bundled ltx2_two_stage.yaml's
stage-2 distilled sigmas, every stage max_num_seqs 8); diffusers is its docs' recipe, LTX2Pipeline
(latent) -> LTX2LatentUpsamplePipeline -> LTX2Pipeline(latents, audio_latents, the stage-2 sigmas,
noise_scale = their first) with one generator per request through the chain: 8 chains one by one
(sequential), or each call over the 8 (batched)."""


def _two_stage_parts(size: str, dtype: str) -> tuple:
    from diffusers import FlowMatchEulerDiscreteScheduler, LTX2LatentUpsamplePipeline, LTX2Pipeline

    from omnistage.testing import ensure

    cache = ROOT / ".omnistage-cache"
    base_path, up_path = (str(ensure(m, size=size, cache_dir=cache / "zoo")) for m in ("ltx2", "ltx2-latent-upsampler"))
    folder = cache / "bench" / f"ltx2-two-stage-{size}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "ltx2_two_stage", "stage_models": {
        "base": base_path, "upsampler": up_path, "refiner": base_path}}))
    base = LTX2Pipeline.from_pretrained(base_path, dtype=torch_dtype(dtype))
    as_is = FlowMatchEulerDiscreteScheduler.from_config(base.scheduler.config, use_dynamic_shifting=False,
                                                        shift_terminal=None)  # the docs' stage-2 scheduler
    pipes = (base, LTX2LatentUpsamplePipeline.from_pretrained(up_path, dtype=torch_dtype(dtype)),
             LTX2Pipeline(**{**base.components, "scheduler": as_is}))
    for pipe in pipes:
        pipe.set_progress_bar_config(disable=True)
    return folder, pipes


def run_two_stage_reference(pipes, kwargs: dict, prompts: list[str], generators: list) -> list:
    from diffusers.pipelines.ltx2.utils import STAGE_2_DISTILLED_SIGMA_VALUES as SIGMAS

    base, upsampler, refiner = pipes
    kwargs = {k: v for k, v in kwargs.items() if k != "output_type"}
    if len(prompts) > 1:
        kwargs["negative_prompt"] = [kwargs["negative_prompt"]] * len(prompts)
    video, audio = base(prompt=prompts, **kwargs, generator=generators, output_type="latent", return_dict=False)
    video = upsampler(latents=video, output_type="latent", return_dict=False)[0]
    second = {k: v for k, v in kwargs.items() if k not in ("height", "width", "num_frames", "num_inference_steps")}
    frames, _ = refiner(prompt=prompts, **second, latents=video, audio_latents=audio, num_inference_steps=len(SIGMAS),
                        sigmas=SIGMAS, noise_scale=SIGMAS[0], guidance_scale=1.0, generator=generators,
                        output_type="np", return_dict=False)
    return [(np.clip(f, 0.0, 1.0) * 255).round().astype(np.uint8) for f in frames]


def run_two_stage_ours(omni, kwargs: dict) -> list:
    params = []
    for request in stage_requests(kwargs):
        base = request.params
        params.append({"base": base, "upsampler": type(base)(seed=base.seed),
                       "refiner": base.model_copy(update={"num_inference_steps": None})})  # the deploy's schedule
    return [out.video for out in omni.generate(PROMPTS, params, use_tqdm=False)]


def bench_two_stage(size: str, repeats: int, dtype: str = "float32") -> dict:
    from omnistage import Omni

    kwargs = call_kwargs("ltx2", size)
    folder, pipes = _two_stage_parts(size, dtype)
    omni = Omni(str(folder), stage_overrides={"*": dict(max_num_seqs=NUM_REQUESTS, dtype=dtype)})
    fns = {"ours": lambda: run_two_stage_ours(omni, kwargs),
           "sequential": lambda: [run_two_stage_reference(pipes, kwargs, [p], generator(i))[0]
                                  for i, p in enumerate(PROMPTS)],
           "batched": lambda: run_two_stage_reference(pipes, kwargs, PROMPTS, [generator(i) for i in range(NUM_REQUESTS)])}
    best, best_cpu, results = {n: float("inf") for n in fns}, {n: float("inf") for n in fns}, {}
    with torch.inference_mode():
        for name, fn in fns.items():  # warm-up
            results[name] = fn()
        for _ in range(repeats):
            for name, fn in fns.items():
                t0, c0 = time.perf_counter(), time.process_time()
                results[name] = fn()
                best[name] = min(best[name], time.perf_counter() - t0)
                best_cpu[name] = min(best_cpu[name], time.process_time() - c0)
    omni.close()
    diff = max(int(np.abs(np.asarray(a, np.int16) - np.asarray(b, np.int16)).max())
               for a, b in zip(results["ours"], results["sequential"]))
    params = sum(p.numel() for pipe in pipes[:2] for c in pipe.components.values() if isinstance(c, torch.nn.Module)
                 for p in c.parameters())
    return {"model": "ltx2-two-stage", "size": size, "device": "cpu", "dtype": dtype, "params_m": params / 1e6,
            "secs": best, "cpu_secs": best_cpu, "max_pixel_diff": diff}


# -- peak RSS, one process per configuration ----------------------------------------------


def memory_probe(model: str, size: str, config: str, device: str = "cpu", dtype: str = "float32") -> float:
    """Load what `config` needs, run it once; the peak RSS (MiB) seen by a psutil sampler."""
    import psutil

    proc, peak, stop = psutil.Process(), [0], threading.Event()

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], proc.memory_info().rss)
            time.sleep(0.005)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    kwargs = call_kwargs(model, size)
    built = build(model, size, (config,), device, dtype)
    with torch.inference_mode():
        runners(built, kwargs, gap=0.0)[config]()
    stop.set()
    sampler.join()
    return max(peak[0], proc.memory_info().rss) / 2**20


# -- video families: ours / diffusers sequential ---------------------------------------------
#
# diffusers' HunyuanVideo15Pipeline cannot decode a batch (its VAE's mid-block attention mask
# breaks at batch > 1), and Cosmos3OmniPipeline and SanaWMPipeline take one prompt per call, so a
# video family has no "diffusers batched" column: ours (request mode, all requests submitted at
# once) against the diffusers pipeline called once per request.

VIDEO_MODELS = ("hunyuan-video", "cosmos3", "sana-wm")
NUM_VIDEO_REQUESTS = 4


def run_ours_video(engine, kwargs: dict) -> list:
    for request in stage_requests(kwargs)[:NUM_VIDEO_REQUESTS]:
        engine.add_request(request)
    done = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                assert out.error is None, out.error
                done[out.request_id] = out.payload.frames
    return [done[f"r{i}"] for i in range(NUM_VIDEO_REQUESTS)]


def run_sequential_video(pipe, kwargs: dict) -> list:
    videos = [_video(pipe(prompt=p, **kwargs, generator=generator(i))) for i, p in enumerate(PROMPTS[:NUM_VIDEO_REQUESTS])]
    return [(np.clip(v, 0.0, 1.0) * 255).round().astype(np.uint8) for v in videos]


def _video(out) -> np.ndarray:
    """The one [F, H, W, 3] video of a diffusers call: `frames[0]` (a batch of one), or Cosmos3's
    `video` and SANA-WM's unbatched `frames`."""
    video = out.video if hasattr(out, "video") else out.frames
    return np.asarray(video[0] if np.ndim(video) == 5 else video)


def bench_video(model: str, size: str, repeats: int, device: str = "cpu", dtype: str = "float32") -> dict:
    from omnistage.config.deploy_fields import StageDeployConfig
    from omnistage.diffusion.engine import DiffusionEngine

    kwargs = call_kwargs(model, size)
    built = build(model, size, ("ours", "sequential"), device, dtype)
    # The bundled deploy file's max_num_seqs: 1 (one video at a time) next to a batch of all.
    one = DiffusionEngine(built["path"], config=StageDeployConfig(max_num_seqs=1, dtype=dtype, devices=(device,)))
    fns = {"ours": lambda: run_ours_video(built["request"], kwargs),
           "ours_one": lambda: run_ours_video(one, kwargs),
           "sequential": lambda: run_sequential_video(built["pipe"], kwargs)}
    best = {name: float("inf") for name in fns}
    best_cpu = dict(best)
    results = {}
    with torch.inference_mode():
        for name, fn in fns.items():  # warm-up
            results[name] = fn()
        for _ in range(repeats):
            for name, fn in fns.items():
                t0, c0 = time.perf_counter(), time.process_time()
                results[name] = fn()
                synchronize(device)
                best[name] = min(best[name], time.perf_counter() - t0)
                best_cpu[name] = min(best_cpu[name], time.process_time() - c0)
    built["request"].close()
    one.close()
    diff = max(int(np.abs(a.astype(np.int16) - b.astype(np.int16)).max())
               for ours in ("ours", "ours_one") for a, b in zip(results[ours], results["sequential"]))
    params = sum(p.numel() for c in built["pipe"].components.values() if isinstance(c, torch.nn.Module)
                 for p in c.parameters())
    return {"model": model, "size": size, "device": device, "dtype": dtype, "params_m": params / 1e6,
            "secs": best, "cpu_secs": best_cpu, "max_pixel_diff": diff,
            "frames": kwargs["num_frames"], "side": kwargs["height"]}


def video_table(rows: list[dict]) -> str:
    lines = [
        f"{NUM_VIDEO_REQUESTS} requests ({NUM_VIDEO_REQUESTS} prompts, seeds 0-{NUM_VIDEO_REQUESTS - 1}), the zoo's "
        "default call (4 steps, CFG on), best of the timed runs, wall clock (process CPU time in brackets). "
        "No diffusers-batched column: diffusers' pipelines cannot run a batch of videos (HunyuanVideo-1.5's VAE "
        "fails at batch > 1; Cosmos3's and SANA-WM's take one prompt per call).",
        "",
        "| model | params | video | ours, batch of 4 (videos/s) | ours, max_num_seqs=1 (videos/s) "
        "| sequential (videos/s) | ours batch / sequential | ours max_num_seqs=1 / sequential "
        "| max pixel diff vs diffusers |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        s, c = r["secs"], r["cpu_secs"]
        lines.append(
            f"| {r['model']} {r['size']} | {r['params_m']:.2f} M | {r['frames']}x{r['side']}x{r['side']} "
            f"| {NUM_VIDEO_REQUESTS / s['ours']:.2f} | {NUM_VIDEO_REQUESTS / s['ours_one']:.2f} "
            f"| {NUM_VIDEO_REQUESTS / s['sequential']:.2f} "
            f"| {s['sequential'] / s['ours']:.2f}x ({c['sequential'] / c['ours']:.2f}x) "
            f"| {s['sequential'] / s['ours_one']:.2f}x ({c['sequential'] / c['ours_one']:.2f}x) "
            f"| {r['max_pixel_diff']} / 255 |")
    return "\n".join(lines)


def peak_rss(model: str, size: str, threads: int, device: str = "cpu", dtype: str = "float32") -> dict[str, float]:
    out = {}
    for config in (CONFIGS[:3] if model in OMNI_MODELS else
                   (c for c in CONFIGS if not (c == "batched" and model in ONE_PROMPT_PER_CALL))):
        cmd = [sys.executable, __file__, "--memory-probe", model, size, config, "--threads", str(threads),
               "--device", device, "--dtype", dtype] + (["--one-prompt"] if len(set(PROMPTS)) == 1 else []) \
            + (["--omni"] if model in OMNI_MODELS else [])
        result = subprocess.run(cmd, capture_output=True, text=True, check=True)
        out[config] = json.loads(result.stdout.strip().splitlines()[-1])["peak_rss_mib"]
    return out


# -- report ------------------------------------------------------------------------------


def table(rows: list[dict]) -> str:
    device, dtype = (rows[0]["device"], rows[0]["dtype"]) if rows else ("cpu", "float32")
    where = "fp32, CPU" if (device, dtype) == ("cpu", "float32") else f"{dtype}, {device}"
    lines = [
        f"{NUM_REQUESTS} requests (8 prompts, seeds 0-7), the zoo's default call (4 steps, CFG on, 64x64 tiny, "
        f"256x256 small), {where}, torch {torch.__version__}, {torch.get_num_threads()} thread(s), best of the "
        "timed runs, wall clock (process CPU time in brackets). Peak RSS: one process per configuration "
        "(load + one run), psutil.",
        "",
        "| model | params | ours (img/s) | 8x sequential (img/s) | diffusers batched (img/s) "
        "| ours / sequential — goal >= 2.5 on tiny | ours / batched — goal >= 0.9 | max pixel diff vs diffusers "
        "| peak RSS ours / seq / batched |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        s, c, m = r["secs"], r["cpu_secs"], r.get("rss", {})
        rss = " / ".join(f"{m[k]:.0f}" if k in m else "-" for k in ("ours", "sequential", "batched")) + " MiB" if m else "-"
        # No batched run where diffusers takes one prompt per call (ONE_PROMPT_PER_CALL).
        batched = f"{NUM_REQUESTS / s['batched']:.2f}" if "batched" in s else "n/a"
        vs_batched = f"{s['batched'] / s['ours']:.2f} ({c['batched'] / c['ours']:.2f})" if "batched" in s else "n/a"
        lines.append(
            f"| {r['model']} {r['size']} | {r['params_m']:.2f} M | {NUM_REQUESTS / s['ours']:.2f} "
            f"| {NUM_REQUESTS / s['sequential']:.2f} | {batched} "
            f"| {s['sequential'] / s['ours']:.2f}x ({c['sequential'] / c['ours']:.2f}x) "
            f"| {vs_batched} | {r['max_pixel_diff']} / 255 | {rss} |")
    lines += [
        "",
        "Staggered arrivals: request i arrives at i x gap (gap = a quarter of one request's latency alone); "
        "mean latency from arrival to the final image (best of the timed runs), max_num_seqs=8.",
        "",
        "| model | gap | step mode mean latency | request mode mean latency | step / request "
        "| peak RSS step / request |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        if r["model"] in OMNI_MODELS or r["model"] in TWO_STAGE_MODELS:  # no staggered runs
            continue
        lat, m = r["latency"], r.get("rss", {})
        rss = f"{m['step_staggered']:.0f} / {m['request_staggered']:.0f} MiB" if m else "-"
        lines.append(
            f"| {r['model']} {r['size']} | {r['gap'] * 1000:.0f} ms | {lat['step_staggered']:.2f} s "
            f"| {lat['request_staggered']:.2f} s | {lat['step_staggered'] / lat['request_staggered']:.2f} | {rss} |")
    return "\n".join(lines)


def audio_table(rows: list[dict]) -> str:
    """The audio families' rows: audio seconds made per wall-clock second."""
    lines = [
        f"{NUM_REQUESTS} requests (8 prompts, seeds 0-7), the zoo's audio call (4 steps, CFG on, negative prompt, "
        f"the whole window), fp32, CPU, torch {torch.__version__}, {torch.get_num_threads()} thread(s), best of "
        "the timed runs, wall clock (process CPU time in brackets).",
        "",
        "| model | params | audio per request | ours (audio s/s) | 8x sequential (audio s/s) "
        "| diffusers batched (audio s/s) | ours / sequential | ours / batched — goal >= 0.9 "
        "| max sample diff vs diffusers | step / request mode mean latency (staggered) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        s, c, lat = r["secs"], r["cpu_secs"], r["latency"]
        total = r["audio_seconds"]
        lines.append(
            f"| {r['model']} {r['size']} | {r['params_m']:.2f} M | {total / NUM_REQUESTS:.3f} s "
            f"| {total / s['ours']:.2f} | {total / s['sequential']:.2f} | {total / s['batched']:.2f} "
            f"| {s['sequential'] / s['ours']:.2f}x ({c['sequential'] / c['ours']:.2f}x) "
            f"| {s['batched'] / s['ours']:.2f} ({c['batched'] / c['ours']:.2f}) | {r['max_pixel_diff']:.1e} "
            f"| {lat['step_staggered']:.2f} / {lat['request_staggered']:.2f} s |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["z-image", "qwen-image"])
    parser.add_argument("--sizes", nargs="+", default=["tiny", "small"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads (1: on a shared machine, OpenMP spin-waits dominate a tiny model)")
    parser.add_argument("--no-memory", action="store_true", help="skip the per-configuration peak RSS processes")
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    parser.add_argument("--one-prompt", action="store_true", help="every request gets the first prompt (seeds 0-7)")
    parser.add_argument("--omni", action="store_true",
                        help="ours through Omni.generate (the product path) for every model, not DiffusionEngine")
    parser.add_argument("--memory-probe", nargs=3, metavar=("MODEL", "SIZE", "CONFIG"), help=argparse.SUPPRESS)
    add_device_args(parser)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.one_prompt:
        PROMPTS[:] = PROMPTS[:1] * NUM_REQUESTS
    if args.omni:
        OMNI_MODELS.extend(args.models)
    if args.memory_probe:
        print(json.dumps({"peak_rss_mib": memory_probe(*args.memory_probe, args.device, args.dtype)}))
        return
    video_rows = [bench_video(model, size, args.repeats, args.device, args.dtype)
                  for model in args.models if model in VIDEO_MODELS for size in args.sizes]
    for row in video_rows:
        print(json.dumps(row), flush=True)
    if video_rows:
        print(video_table(video_rows))
        if not args.no_write:
            write_section("Diffusion: video", "benchmarks/bench_diffusion.py", video_table(video_rows))
    rows = []
    for size in args.sizes if "ltx2-two-stage" in args.models else ():
        row = bench_two_stage(size, args.repeats, args.dtype)
        print(json.dumps(row), flush=True)
        print(table([row]).split("\n\nStaggered")[0])  # printed only; no staggered runs
    for model in [m for m in args.models if m not in VIDEO_MODELS + TWO_STAGE_MODELS]:
        for size in args.sizes:
            row = bench(model, size, args.repeats, args.device, args.dtype)
            if not args.no_memory:
                row["rss"] = peak_rss(model, size, args.threads, args.device, args.dtype)
            print(json.dumps(row), flush=True)
            rows.append(row)
    image_rows = [r for r in rows if r["model"] not in AUDIO_MODELS]
    audio_rows = [r for r in rows if r["model"] in AUDIO_MODELS]
    sections = [("Diffusion", table(image_rows), image_rows), ("Diffusion: audio", audio_table(audio_rows), audio_rows)]
    for heading, body, section_rows in sections:
        if section_rows:
            print(body)
            if not args.no_write:
                write_section(heading, "benchmarks/bench_diffusion.py", body)


if __name__ == "__main__":
    main()
