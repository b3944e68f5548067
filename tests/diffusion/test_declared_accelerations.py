"""Every native family's declared accelerations (accel/declaration.py) run on its zoo model,
and everything it does not declare is refused at start-up naming the field and the family.

One process, per family: each declared step cache at threshold 0 gives the plain output
bit for bit, with its hooks having run for the request (its per-branch state is filled;
the pairs test_step_cache.py and the families' accel tests check so are left to them);
model offload (with the first cache) gives the plain output bit for bit; VAE tiling,
int8 weights and regional compile apply to the loaded pipeline (the VAE tiles, the
transformer's linear weights are int8, its blocks are compiled), and LoRA finds the
family's diffusers loader. Two ranks, one spawn for every family: CFG-parallel (with VAE
patch parallel where declared; each rank computes one branch's forwards, and its denoiser
half the rows), Ulysses and ring each equal one rank (ring once per ring-attention processor;
the families and processors test_sequence_parallel.py runs are left to it); and each of our step
caches, with CFG parallel and with Ulysses, skips what one rank skips, with its output.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Any

import numpy as np
import pytest
import torch

from omnistage.config.deploy_fields import StageDeployConfig
from omnistage.diffusion.accel import apply_accelerations, check_family, lora, quantization
from omnistage.diffusion.accel import compile as regional_compile
from omnistage.diffusion.accel.declaration import CACHE_BACKENDS, requested, takes
from omnistage.diffusion.registry import native_keys, pipeline_class
from omnistage.testing import call_kwargs as zoo_call_kwargs
from omnistage.testing import joyimage_models, list_models
from omnistage.testing.diffusion_models import default_input_image

import test_hunyuan_video_accel
import test_parity_flux_kontext
import test_parity_glm_image
import test_parity_hunyuan_video
import test_parity_kandinsky6
import test_parity_ltx2
import test_parity_ltx2_condition
import test_parity_ltx2_i2v
import test_parity_qwen_image_edit
import test_parity_sana_video
import test_parity_sana_wm
import test_parity_wan
import test_parity_wan_vace
import test_sequence_parallel
import test_step_cache
from parity import request_for
from two_ranks import rank_results, run_two_ranks, save_rank_results

STEPS = 2
TOLERANCE = {"cfg": 1e-4, "ulysses": 1e-3, "ring": 1e-3}
ZERO = {  # threshold 0: every step computes
    "first_block_cache": {"threshold": 0.0, "warmup_steps": 0},
    "tea_cache": {"rel_l1_thresh": 0.0},
    "easycache": {"threshold": 0.0, "warmup_steps": 0},
    "cache_dit": {"residual_diff_threshold": 0.0, "max_warmup_steps": 0},
}
CHECKED_ELSEWHERE = {
    *((name, backend) for name in test_step_cache.FAMILIES for backend in test_step_cache.THRESHOLD),
    *((test_hunyuan_video_accel.NAME, backend) for backend in test_hunyuan_video_accel.THRESHOLD),
    ("qwen-image-edit-plus", "first_block_cache"),  # test_accel_qwen_image_v2.py
}
"""(family, step cache) pairs that test_step_cache.py (or the family's accel test) runs at threshold 0
(the plain output bit for bit, nothing skipped, at more steps) and at a high threshold (it skips): not
run again here."""


@dataclass(frozen=True)
class Case:
    """How to send a zoo model's family one request."""

    name: str
    call: dict[str, Any] = dataclass_field(default_factory=dict)
    """Changes to the zoo's call kwargs."""
    request: Any = None
    """(call, seed) -> our request, where it takes other kwargs than diffusers' call."""
    context: Any = contextlib.nullcontext
    """What its runs are made in (JoyAI-Image-Edit-Plus: its references' buckets shrunk)."""

    @property
    def key(self) -> str:
        return next(m.reference_class for m in list_models() if m.name == self.name).split(".")[-1]

    def make_request(self, seed: int = 3, request_id: str = "req", **overrides):
        call = {**zoo_call_kwargs(self.name), **self.call, "num_inference_steps": STEPS, **overrides}
        return (self.request or request_for)(call, seed, request_id)


def _case(name: str, call: dict[str, Any] | None = None, parity_class: Any = None) -> Case:
    request = parity_class().request if parity_class is not None else None
    return Case(name, call or {}, request)


def _refiner_request(call: dict[str, Any], seed: int, request_id: str = "req"):
    """The SDXL refiner continues a base's latents: seeded ones stand in for them."""
    request = request_for(call, seed, request_id)
    generator = torch.Generator().manual_seed(seed)
    request.condition["latents"] = torch.randn(call.get("num_images_per_prompt", 1), 4, 8, 8, generator=generator)
    return request


def _upsampler_request(call: dict[str, Any], seed: int, request_id: str = "req"):
    """The LTX-2 latent upsampler takes a first stage's video latents: seeded ones stand in for them."""
    from omnistage.diffusion.params import DiffusionParams
    from omnistage.diffusion.request import DiffusionRequest

    latents = torch.randn(1, 4, 2, 4, 4, generator=torch.Generator().manual_seed(seed))
    return DiffusionRequest(request_id, "", DiffusionParams(seed=seed), condition={"latents": latents})


def _speech_request(call: dict[str, Any], seed: int, request_id: str = "req"):
    """OmniVoice (a speech model on the diffusion engine) reads a text to speak."""
    from omnistage.diffusion.params import DiffusionParams
    from omnistage.diffusion.request import DiffusionRequest

    return DiffusionRequest(request_id, call["text"],
                            DiffusionParams(seed=seed, num_inference_steps=call["num_inference_steps"]))


def _cases() -> dict[str, Case]:
    image = {"image": default_input_image()}
    true_cfg = {"negative_prompt": "blurry", "true_cfg_scale": 2.0}  # FLUX guides only with both
    special = {
        "flux": _case("flux", true_cfg),
        "flux-kontext": _case("flux-kontext", {**image, **true_cfg}, test_parity_flux_kontext.TestFluxKontext),
        "qwen-image-edit": _case("qwen-image-edit", image, test_parity_qwen_image_edit.TestQwenImageEdit),
        "qwen-image-edit-plus": _case("qwen-image-edit-plus", {"image": [default_input_image()]},
                                      test_parity_qwen_image_edit.TestQwenImageEdit),
        "wan-i2v": _case("wan-i2v", test_parity_wan.I2V_CALL),
        "hunyuan-video": _case("hunyuan-video", test_parity_hunyuan_video.CALL),
        "hunyuan-video-i2v": _case("hunyuan-video-i2v", test_parity_hunyuan_video.i2v_call()),
        "glm-image": _case("glm-image", {"prior_token_ids": test_parity_glm_image.prior_tokens(0)},
                           test_parity_glm_image.TestGlmImageDiT),
        "ltx2": _case("ltx2", {}, test_parity_ltx2.TestLTX2),
        "ltx2-i2v": _case("ltx2-i2v", test_parity_ltx2_i2v.CALL, test_parity_ltx2_i2v.TestLTX2I2V),
        "ltx2-condition": _case("ltx2-condition", test_parity_ltx2_condition.CALL,
                                test_parity_ltx2_condition.TestLTX2Condition),
        # frame_rate -> fps
        "kandinsky6": _case("kandinsky6", test_parity_kandinsky6.CALL, test_parity_kandinsky6.TestKandinsky6),
        # The edit families' default size is about a megapixel: the tiny one is asked for.
        "longcat-image-edit": _case("longcat-image-edit", {**image, "height": 64, "width": 64}),
        "joyai-image-edit": _case("joyai-image-edit", image),
        "joyai-image-edit-plus": Case("joyai-image-edit-plus", {"image": joyimage_models.plus_references()[:1]},
                                      context=joyimage_models.small_buckets),
        # An early start: the refiner runs all STEPS steps (the two-rank test counts them).
        "sdxl-refiner": Case("sdxl-refiner", {"denoising_start": 0.01}, _refiner_request),
        "ltx2-latent-upsampler": Case("ltx2-latent-upsampler", {}, _upsampler_request),
        "qwen-image-layered": _case("qwen-image-layered", {**image, "height": 64, "width": 64}),
        "sana-video": _case("sana-video", {}, test_parity_sana_video.TestSanaVideoT2V),  # `frames` -> num_frames
        "sana-video-i2v": _case("sana-video-i2v", test_parity_sana_video.I2V_CALL,
                                test_parity_sana_video.TestSanaVideoI2V),
        "wan-vace": _case("wan-vace", test_parity_wan_vace.CALL, test_parity_wan_vace.TestWanVACE),
        # An input image and a camera path (a None camera field is not sent).
        "sana-wm": _case("sana-wm", test_parity_sana_wm.CALL, test_parity_sana_wm.TestSanaWM),
        # No CFG: Helios takes no CFG-parallel, and its two chunks cost twice a plain call's steps.
        "helios": _case("helios", {"guidance_scale": 1.0}),
        # A speech zoo model whose unmasking stage is a native diffusion pipeline.
        "omnivoice": Case("omnivoice", {}, _speech_request),
    }
    names = [m.name for m in list_models() if m.kind == "diffusion" or m.name in special]
    return {name: special.get(name) or _case(name) for name in names}


CASES = _cases()


def test_every_native_pipeline_has_a_zoo_model():
    assert {case.key for case in CASES.values()} == set(native_keys())


def run(pipeline, case: Case, seed: int = 3, **overrides):
    with case.context():
        (state,) = pipeline.denoise([case.make_request(seed, **overrides)])
        (arr,) = pipeline.decode_arrays([state])
    return arr, state


def _load(case: Case, path: str, **fields):
    # Torch's linears on every run: offload leaves them unpacked (accel/prepack.py), and the runs here
    # must equal bit for bit; test_prepack.py and the parity tests run the packed ones.
    return pipeline_class(case.key).from_pretrained(path, deploy=StageDeployConfig(prepack_linears=False, **fields))


@pytest.mark.parametrize("name", list(CASES))
def test_declared_accelerations_run_and_the_rest_are_refused(zoo, name):
    case = CASES[name]
    cls = pipeline_class(case.key)
    decl = cls.supported_accelerations
    path = str(zoo(name))
    plain = _load(case, path)
    rows = denoiser_rows(plain)
    want, state = run(plain, case)
    PLAIN[name] = (want, plain.state_metrics(state), sum(rows))

    # Step caches at threshold 0: the plain output, with the cache deciding every step. The
    # first one also runs with model offload, which changes where weights wait, not the output.
    # mag_cache is not rerun here: it hooks where easycache does and decides at the same point (before
    # the first block), so this loop would prove nothing new for ~10 s more; test_mag_cache.py runs it.
    caches = [b for b in decl.step_caches if b in ZERO and (name, b) not in CHECKED_ELSEWHERE]
    for i, backend in enumerate(caches):
        fields = {"cache_backend": backend, "cache_config": ZERO[backend]}
        if backend == "cache_dit":  # it runs one request at a time
            fields["max_num_seqs"] = 1
        if i == 0 and decl.offload:
            fields["offload"] = "model"
        cached = _load(case, path, **fields)
        assert cached.accelerations == [backend] + (["offload"] if "offload" in fields else [])
        got, state = run(cached, case)
        assert np.array_equal(got, want), backend
        assert state.step_cache is not None and state.step_cache.num_skipped == 0
        if backend != "cache_dit":  # cache-dit keeps its state on the transformer
            assert state.step_cache.branches, f"{backend}: no block hook ran"
    if decl.offload and not caches:
        offloaded = _load(case, path, offload="model")
        assert offloaded.accelerations == ["offload"] and np.array_equal(run(offloaded, case)[0], want)

    # Applied to the loaded pipeline, each leaving its mark (no run: the others' tests run them).
    fields = {"vae_use_tiling": decl.vae_tiling, "quantization": "int8" if decl.quantization else None,
              "compile": decl.compile}
    applied = apply_accelerations(plain, StageDeployConfig(**fields))
    assert sorted(applied) == sorted(n for n, on in (("vae_tiling", decl.vae_tiling), ("compile", decl.compile),
                                                     ("quantization", decl.quantization)) if on)
    if decl.vae_tiling:
        assert plain.vae.use_tiling
    if decl.quantization:
        for model in quantization.quantized_components(plain).values():
            linear = next(m for m in model.modules() if isinstance(m, torch.nn.Linear))
            assert type(linear.weight).__module__.startswith("torchao.")  # a torchao int8 weight, not a Parameter
    if decl.compile:
        assert regional_compile.compiled_blocks(plain)
    if decl.lora:
        assert hasattr(lora.lora_loader(plain), "load_lora_weights")

    # Everything it does not declare is refused by name before anything loads.
    for fields in PROBES:
        deploy = StageDeployConfig(**fields)
        refused = [field for field, value in requested(deploy) if not takes(decl, field, value)]
        if not refused:
            check_family("0 (diffusion)", deploy, cls)
            continue
        with pytest.raises(ValueError) as error:
            check_family("0 (diffusion)", deploy, cls)
        assert all(f"{field}=" in str(error.value) for field in refused) and case.key in str(error.value)


PLAIN: dict[str, tuple[np.ndarray, dict, int]] = {}
"""Each family's plain output, metrics and denoiser rows, which the two-rank test compares with
(it loads the family again when run alone)."""


def denoiser_rows(pipeline) -> list[int]:
    """Records the batch rows of each call of the pipeline's denoiser(s): one row per request and
    CFG branch, whether a family batches its branches in one call or calls once per branch."""
    rows: list[int] = []

    def record(model, args, kwargs):
        x = kwargs.get("hidden_states", kwargs.get("sample", args[0] if args else None))
        rows.append(len(x))  # a batch tensor, or Z-Image's list of one latent per row

    for name in ("transformer", "transformer_2", "unet"):
        if (model := getattr(pipeline, name, None)) is not None:
            model.register_forward_pre_hook(record, with_kwargs=True)
    return rows

PROBES = [
    *({"cache_backend": backend} for backend in CACHE_BACKENDS),
    {"executor": "mp", "num_devices": 2, "cfg_parallel_size": 2, "vae_patch_parallel_size": 2},
    {"executor": "mp", "num_devices": 2, "ulysses_degree": 2},
    {"executor": "mp", "num_devices": 2, "ring_degree": 2},
    {"vae_use_tiling": True},
    {"offload": "model"},
    {"quantization": "int8"},
    {"lora_adapters": {"a": "a.safetensors"}},
    {"compile": True},
]


# -- two ranks: every family's declared parallel degrees in one spawn --------------------------

TWO = {"executor": "mp", "num_devices": 2}
ULYSSES = {**TWO, "ulysses_degree": 2}


def _ring_runners() -> set[str]:
    """The first family (in CASES order) of each ring-attention processor: the families that share
    one (Qwen-Image's edit variants, FLUX Kontext, Wan's) differ from it in nothing the ring
    touches that their Ulysses run, through the same processor and split, does not check. None for
    the processors test_sequence_parallel.py runs ring through (Z-Image's, Wan's)."""
    first: dict[Any, str] = {}
    for name, case in CASES.items():
        plan = pipeline_class(case.key).supported_accelerations.sequence_parallel
        if plan is not None and plan.ring_processor is not None:
            first.setdefault(plan.ring_processor, name)
    ring_checked = {pipeline_class(CASES[name].key).supported_accelerations.sequence_parallel.ring_processor
                    for name in test_sequence_parallel.RING_FAMILIES}
    return {name for processor, name in first.items() if processor not in ring_checked}


RING_RUNNERS = _ring_runners()


def parallel_runs(name: str) -> dict[str, dict[str, Any]]:
    """What a family runs on two ranks: its declared degrees, by label."""
    decl = pipeline_class(CASES[name].key).supported_accelerations
    runs = {}
    if decl.cfg_parallel:  # VAE patch parallel shares out the decode of the same two ranks
        runs["cfg"] = {**TWO, "cfg_parallel_size": 2, "vae_patch_parallel_size": 2 if decl.vae_patch_parallel else 1}
    if decl.sequence_parallel is not None and name not in test_sequence_parallel.FAMILIES:  # checked there, tighter
        runs["ulysses"] = ULYSSES
    if decl.ring and name in RING_RUNNERS:
        runs["ring"] = {**TWO, "ring_degree": 2}
    return runs


CACHED_PARALLEL = ("z-image", {  # settings that skip some of the 12 steps' 24 forwards on one rank (6-14)
    "first_block_cache": {"threshold": 0.6, "warmup_steps": 1},
    "tea_cache": {"rel_l1_thresh": 0.4},
    "easycache": {"threshold": 0.2, "warmup_steps": 1},
    "mag_cache": {"threshold": 0.3, "warmup_steps": 1},
}, 12)
"""Each of our step caches on two ranks (family, backend -> cache_config, steps): its decisions are per
request and CFG branch, so with CFG parallel (one branch per rank) and Ulysses (a shard of the sequence per
rank) the ranks skip what one rank skips. One family, in the same spawn: a spawn of its own costs ~10 s.
(cache-dit is tested in test_cache_dit.py; the families whose caches run on a rank's shard of the
sequence, Qwen-Image, FLUX, FLUX.2, Wan and SD3, in test_step_cache_sequence_parallel.py.) Z-Image's plan
splits the sequence as its first block takes it and gathers it as its last returns it, so the caches see it
whole; the first-block cache gathers its first block's output, a shard (test_step_cache_sequence_parallel.py
runs it under ring too, and on rows whose padded length changes)."""


def _rank_main(rank: int, port: int, paths: dict[str, str], out_dir: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    results = {}
    try:
        for name, path in paths.items():
            case = CASES[name]
            for label, fields in parallel_runs(name).items():
                pipeline = _load(case, path, **fields)
                rows = denoiser_rows(pipeline)
                arr, state = run(pipeline, case)
                results[f"{name} {label}"] = (arr, pipeline.state_metrics(state), pipeline.accelerations, sum(rows))
        name, configs, steps = CACHED_PARALLEL
        for backend, config in configs.items():
            for label, fields in (("cfg", parallel_runs(name)["cfg"]), ("ulysses", ULYSSES)):
                pipeline = _load(CASES[name], paths[name], **fields, cache_backend=backend, cache_config=config)
                arr, state = run(pipeline, CASES[name], num_inference_steps=steps)
                results[f"{name} {label} {backend}"] = (arr, pipeline.state_metrics(state), pipeline.accelerations, 0)
    finally:  # rank 1 keeps its metrics only (rank 0's output is the one returned)
        if rank == 1:
            results = {key: (None, *rest) for key, (_, *rest) in results.items()}
        save_rank_results(out_dir, rank, results)
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_rank_results(zoo, tmp_path_factory):
    paths = {name: str(zoo(name)) for name in CASES}
    out_dir = str(tmp_path_factory.mktemp("declared_parallel"))
    run_two_ranks(_rank_main, paths, out_dir, timeout=400)
    return rank_results(out_dir)


def test_declared_parallel_degrees_on_two_ranks_equal_one_rank(zoo, two_rank_results):
    """Over 30 s with its fixture (30 s in a quiet parallel run on two cores): two rank processes
    import torch and diffusers, then load and run every family once per declared degree. One
    spawn for all families; one per family cost that start-up each time."""
    checked = []
    for name, case in CASES.items():
        runs = parallel_runs(name)
        for label, fields in runs.items():
            got, metrics, applied, rows = two_rank_results[0][f"{name} {label}"]
            _, rank1_metrics, _, rank1_rows = two_rank_results[1][f"{name} {label}"]
            if name not in PLAIN:  # this test runs without the one-rank test before it
                plain = _load(case, str(zoo(name)))
                one_rank_rows = denoiser_rows(plain)
                want, state = run(plain, case)
                PLAIN[name] = (want, plain.state_metrics(state), sum(one_rank_rows))
            want, one_rank_metrics, one_rank_rows = PLAIN[name]
            vae = ["vae_patch_parallel"] if fields.get("vae_patch_parallel_size", 1) > 1 else []
            assert applied == {"cfg": ["cfg_parallel"] + vae}.get(label, ["sequence_parallel"]), (name, label)
            assert np.abs(got - want).max() <= TOLERANCE[label], (name, label)
            if label == "cfg":  # one rank ran both branches; with CFG parallel each rank runs one of them
                assert one_rank_metrics["num_forwards_computed"] == 2 * STEPS, f"{name}: the call must guide"
                assert metrics["num_forwards_computed"] == rank1_metrics["num_forwards_computed"] == STEPS, name
                # ... and so does the denoiser: each rank computes half the rows one rank did (its branch's)
                assert 2 * rows == 2 * rank1_rows == one_rank_rows, name
            checked.append(f"{name} {label}")
    assert checked


@pytest.mark.parametrize("backend", list(CACHED_PARALLEL[1]))
def test_a_step_cache_on_two_ranks_skips_what_one_rank_skips(zoo, two_rank_results, backend):
    name, configs, steps = CACHED_PARALLEL
    one_rank = _load(CASES[name], str(zoo(name)), cache_backend=backend, cache_config=configs[backend])
    want, state = run(one_rank, CASES[name], num_inference_steps=steps)
    want_metrics = one_rank.state_metrics(state)
    assert want_metrics["num_forwards_skipped"] > 0
    for label in ("cfg", "ulysses"):
        got, metrics, applied, _ = two_rank_results[0][f"{name} {label} {backend}"]
        _, rank1_metrics, _, _ = two_rank_results[1][f"{name} {label} {backend}"]
        assert backend in applied and np.abs(got - want).max() <= TOLERANCE[label], label
        if label == "cfg":  # each rank runs (and caches) one branch: their counts add up to one rank's
            assert {k: metrics[k] + rank1_metrics[k] for k in want_metrics} == want_metrics
        else:  # each rank holds a shard of every row: the same decisions as one rank
            assert metrics == rank1_metrics == want_metrics


def test_the_engine_refuses_an_undeclared_acceleration_before_loading(zoo):
    from omnistage.diffusion.engine import DiffusionEngine

    with pytest.raises(ValueError, match="stage diffusion: compile=True: StableDiffusion3Pipeline cannot take it"):
        DiffusionEngine(str(zoo("sd3")), config=StageDeployConfig(compile=True))


def test_cfg_parallel_is_refused_without_two_ranks(zoo):
    deploy = StageDeployConfig(executor="mp", num_devices=2, cfg_parallel_size=2)
    with pytest.raises(ValueError, match="cfg_parallel_size=2 needs executor 'mp' with num_devices=2"):
        pipeline_class("ZImagePipeline").from_pretrained(str(zoo("z-image")), deploy=deploy)
