"""Helpers for parity tests: our pipelines against the diffusers pipeline's own output.

Requests are built from the same keyword arguments the reference `__call__` gets
(`omnistage.testing.call_kwargs(name)` plus overrides), so both sides always see the same inputs.
Outputs are compared as float arrays in [0, 1]: `decode_arrays` against `output_type="np"`.

`ParityTests` holds the tests every family shares; a family's test class configures it with
a few class attributes and adds its own tests (mixed batches, defaults, input checks).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np
import pytest
import torch

from omnistage.config.deploy_fields import StageDeployConfig
from omnistage.core.types import ImagePayload, VideoPayload
from omnistage.diffusion.params import DiffusionParams
from omnistage.diffusion.pipeline import DenoiseState, DiffusionPipelineBase
from omnistage.diffusion.request import DiffusionRequest
from omnistage.diffusion.registry import pipeline_class
from omnistage.testing import call_kwargs as zoo_call_kwargs
from omnistage.testing.diffusion_models import default_input_image

TOLERANCE = 1e-3

# Prompts of clearly different token lengths, for batches that need padding.
BATCH_PROMPTS = [
    "a cat",
    "a photo of a small dog sitting on a long red wooden chair in a sunny garden full of flowers",
    "a tree in the snow at night",
]
BATCH_SEEDS = [11, 22, 33]


def load_reference(pipeline_class: Any, path: Any, **components: Any) -> Any:
    """The diffusers pipeline in fp32 (`components` are passed instead of loaded)."""
    pipe = pipeline_class.from_pretrained(str(path), dtype=torch.float32, **components)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def sized_reference(pipe: Any, module: Any) -> Callable[..., Any]:
    """`pipe` called with the asked height and width, for a diffusers pipeline that takes no output
    size and computes it from the input image with `module.calculate_dimensions`: the reference is
    told the size through that one function, as if it had computed it; the rest of its call is its own."""
    from unittest import mock

    def reference(height: int, width: int, **kwargs: Any) -> Any:
        with mock.patch.object(module, "calculate_dimensions", lambda area, ratio: (width, height)):
            return pipe(**kwargs)

    return reference


def reference_arrays(reference: Any, call_kwargs: dict[str, Any], seed: int) -> np.ndarray:
    """The diffusers pipeline's float output for `call_kwargs` and `seed` (CPU generator)."""
    out = reference(**call_kwargs, generator=torch.Generator("cpu").manual_seed(seed), output_type="np")
    return np.asarray(out.frames[0] if hasattr(out, "frames") else out.images)


def request_for(call_kwargs: dict[str, Any], seed: int, request_id: str = "req") -> DiffusionRequest:
    """The DiffusionRequest that carries the same inputs as diffusers `call_kwargs`."""
    kwargs = dict(call_kwargs)
    prompt = kwargs.pop("prompt")
    image = kwargs.pop("image", None)
    fields = {"num_outputs_per_prompt": kwargs.pop("num_images_per_prompt", 1)}
    for name in list(kwargs):
        if name in DiffusionParams.model_fields:
            fields[name] = kwargs.pop(name)
    params = DiffusionParams(seed=seed, extras=kwargs, **fields)  # whatever is left is an extra
    images = [] if image is None else (list(image) if isinstance(image, list) else [image])
    return DiffusionRequest(request_id=request_id, prompt=prompt, params=params, images=images)


def run_arrays(pipeline: DiffusionPipelineBase, requests: list[DiffusionRequest]) -> list[np.ndarray]:
    """All requests through one request-mode run (`denoise`, the body of `forward`), decoded to floats."""
    return pipeline.decode_arrays(pipeline.denoise(requests))


def run_staggered(pipeline: DiffusionPipelineBase, first: DiffusionRequest, second: DiffusionRequest,
                  join_after: int) -> list[np.ndarray]:
    """Step mode: `first` runs alone for `join_after` steps, then `second` is encoded and the
    two share every denoise_step call until each is done (each leaves when it finishes)."""
    states: list[DenoiseState] = pipeline.encode([pipeline.prepare_request(first)])
    for _ in range(join_after):
        pipeline.denoise_step(states)
    states += pipeline.encode([pipeline.prepare_request(second)])
    while any(not s.is_done for s in states):
        pipeline.denoise_step([s for s in states if not s.is_done])
    return pipeline.decode_arrays(states)


def max_abs_diff(a: np.ndarray, b: np.ndarray) -> float:
    assert a.shape == b.shape, f"shape {a.shape} != reference {b.shape}"
    return float(np.abs(a.astype(np.float64) - b.astype(np.float64)).max())


def assert_all_close(got: list[np.ndarray], expected: list[np.ndarray]) -> None:
    """One output per reference output, each within TOLERANCE of it."""
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert max_abs_diff(g, e) <= TOLERANCE


def assert_rejected(pipeline: DiffusionPipelineBase, field: str, params: DiffusionParams | None = None,
                    images: list[Any] | None = None, prompt: str = "a cat") -> None:
    """`prepare_request` (what the engine runs before queueing) refuses the request with a
    ValueError naming `field`."""
    request = DiffusionRequest("r", prompt, params or DiffusionParams(), images=images or [])
    with pytest.raises(ValueError, match=field):
        pipeline.prepare_request(request)


# The smallest deploy config that asks for each acceleration, for families that do not declare it.
UNDECLARED_DEPLOY: dict[str, dict[str, Any]] = {
    "ulysses_degree": {"executor": "mp", "num_devices": 2, "ulysses_degree": 2},
    "ring_degree": {"executor": "mp", "num_devices": 2, "ring_degree": 2},
    "cache_backend": {"cache_backend": "first_block_cache"},
}


def assert_refused_at_load(pipeline_class: type[DiffusionPipelineBase], path: Any, field: str) -> None:
    """Loading with the acceleration of deploy `field` (see UNDECLARED_DEPLOY) raises a ValueError naming it."""
    with pytest.raises(ValueError, match=field):
        pipeline_class.from_pretrained(path, deploy=StageDeployConfig(**UNDECLARED_DEPLOY[field]))


def _frozen(value: Any) -> Any:
    """A hashable stand-in for one call kwarg (PIL images by their pixels)."""
    if isinstance(value, list | tuple):
        return tuple(_frozen(v) for v in value)
    if hasattr(value, "tobytes") and hasattr(value, "mode"):  # a PIL image
        return (value.mode, value.size, value.tobytes())
    return value


def reference_outputs(reference: Any) -> Callable[[dict[str, Any], int], np.ndarray]:
    """`get(call_kwargs, seed)`: the reference output, computed once for each (call, seed), so
    tests that ask for the same one share a reference run."""
    cache: dict[Any, np.ndarray] = {}

    def get(call_kwargs: dict[str, Any], seed: int) -> np.ndarray:
        key = (seed, tuple(sorted((k, _frozen(v)) for k, v in call_kwargs.items())))
        if key not in cache:
            cache[key] = reference_arrays(reference, call_kwargs, seed)
        return cache[key]

    return get


def reference_av_outputs(reference: Any) -> Callable[[dict[str, Any], int], tuple[np.ndarray, np.ndarray]]:
    """`get(call_kwargs, seed)`: the reference (frames, soundtrack) of a video-with-audio pipeline
    (LTX-2, Kandinsky 6), one reference run for each (call, seed)."""
    cache: dict[Any, tuple[np.ndarray, np.ndarray]] = {}

    def get(call_kwargs: dict[str, Any], seed: int) -> tuple[np.ndarray, np.ndarray]:
        key = (seed, tuple(sorted((k, _frozen(v)) for k, v in call_kwargs.items())))
        if key not in cache:
            out = reference(**call_kwargs, generator=torch.Generator("cpu").manual_seed(seed), output_type="np")
            cache[key] = (np.asarray(out.frames[0]), np.asarray(out.audio[0]))
        return cache[key]

    return get


def av_request(call_kwargs: dict[str, Any], seed: int, request_id: str = "req") -> DiffusionRequest:
    """Our request for a video-with-audio call: diffusers' `frame_rate` is our `fps`, and LTX-2's
    STG block list (one block in these tests) our `stg_block`."""
    kwargs = dict(call_kwargs)
    fps = kwargs.pop("frame_rate")
    if "spatio_temporal_guidance_blocks" in kwargs:
        kwargs["stg_block"] = kwargs.pop("spatio_temporal_guidance_blocks")[0]
    request = request_for(kwargs, seed, request_id)
    request.params = request.params.model_copy(update={"fps": fps})
    return request


class ReferenceFixtures:
    """The zoo model, diffusers' pipeline and ours, loaded once per test class.

    A family's test class sets `zoo_name`, `reference_class` (the diffusers class name) and
    `pipeline_class`; it overrides the `call` or `reference` fixture when its reference call
    needs more (an input image, a processor)."""

    zoo_name: ClassVar[str]
    reference_class: ClassVar[str]
    pipeline_class: ClassVar[type[DiffusionPipelineBase]]

    @pytest.fixture(scope="class")
    @classmethod
    def path(cls, zoo):
        return zoo(cls.zoo_name)

    @pytest.fixture(scope="class")
    @classmethod
    def call(cls) -> dict[str, Any]:
        """The reference call: the zoo's defaults."""
        return zoo_call_kwargs(cls.zoo_name)

    @pytest.fixture(scope="class")
    @classmethod
    def reference(cls, path):
        import diffusers

        return load_reference(getattr(diffusers, cls.reference_class), path)

    @pytest.fixture(scope="class")
    @classmethod
    def expected(cls, reference) -> Callable[[dict[str, Any], int], np.ndarray]:
        return reference_outputs(reference)

    @pytest.fixture(scope="class")
    @classmethod
    def ours(cls, path):
        return cls.pipeline_class.from_pretrained(path)

    def request(self, call_kwargs: dict[str, Any], seed: int, request_id: str = "req") -> DiffusionRequest:
        """Our request for a reference call (override where the two take different kwargs)."""
        return request_for(call_kwargs, seed, request_id)


class SoundtrackFixtures:
    """Mixed into a video-with-audio family's parity class (before ParityTests): `reference_av`
    (frames and soundtrack of one reference run per call and seed), `expected` from its frames,
    and requests through `av_request`."""

    @pytest.fixture(scope="class")
    @classmethod
    def reference_av(cls, reference):
        return reference_av_outputs(reference)

    @pytest.fixture(scope="class")
    @classmethod
    def expected(cls, reference_av):
        return lambda call, seed: reference_av(call, seed)[0]

    def request(self, call_kwargs: dict[str, Any], seed: int, request_id: str = "req") -> DiffusionRequest:
        return av_request(call_kwargs, seed, request_id)


class ParityTests(ReferenceFixtures):
    """What every native pipeline must match diffusers on (the role of diffusers'
    PipelineTesterMixin): one request alone, a batch of three, requests that join a running
    batch, and the uint8 payload of `forward`. The class attributes below say what differs."""

    alone_overrides: ClassVar[dict[str, Any]] = {}
    """Changes to `call` for the alone and forward tests."""
    alone_seed: ClassVar[int] = 0
    staggered_seeds: ClassVar[tuple[int, int]] = (1, 2)
    staggered_short: ClassVar[dict[str, Any]] = {}
    """Changes to the short request of the staggered test (e.g. CFG off for it alone)."""

    def batch_calls(self, call: dict[str, Any]) -> list[dict[str, Any]]:
        """The three reference calls of the batch test (default: the BATCH_PROMPTS)."""
        return [dict(call, prompt=p) for p in BATCH_PROMPTS]

    # -- helpers for the family's own tests --------------------------------------------------

    def assert_batch_matches(self, pipeline: DiffusionPipelineBase, expected: Callable, calls: list[dict[str, Any]],
                             seeds: list[int] = BATCH_SEEDS) -> list[np.ndarray]:
        """All `calls` in one request-mode run match each one run alone by diffusers; returns ours."""
        got = run_arrays(pipeline, [self.request(c, s, f"r{i}") for i, (c, s) in enumerate(zip(calls, seeds))])
        assert_all_close(got, [expected(c, s) for c, s in zip(calls, seeds)])
        return got

    def assert_staggered_matches(self, pipeline: DiffusionPipelineBase, expected: Callable,
                                 long_call: dict[str, Any], short_call: dict[str, Any]) -> None:
        """A 4-step request runs alone for 2 steps, then a 2-step one joins; both match diffusers."""
        (long_seed, short_seed), join_after = self.staggered_seeds, short_call["num_inference_steps"]
        got = run_staggered(pipeline, self.request(long_call, long_seed, "long"),
                            self.request(short_call, short_seed, "short"), join_after=join_after)
        assert_all_close(got, [expected(long_call, long_seed), expected(short_call, short_seed)])

    # -- the shared tests --------------------------------------------------------------------

    def test_registered_as_native(self):
        assert pipeline_class(self.reference_class) is self.pipeline_class

    def test_alone_matches_diffusers(self, ours, expected, call):
        call = dict(call, **self.alone_overrides)
        (got,) = run_arrays(ours, [self.request(call, self.alone_seed)])
        assert max_abs_diff(got, expected(call, self.alone_seed)) <= TOLERANCE

    def test_batch_matches_each_alone(self, ours, expected, call):
        # Different prompt lengths and seeds in one call.
        got = self.assert_batch_matches(ours, expected, self.batch_calls(call))
        for a, b in itertools.combinations(got, 2):  # different prompts and seeds: really different outputs
            assert a.shape != b.shape or max_abs_diff(a, b) > 1e-2

    def test_staggered_requests_share_steps(self, ours, expected, call):
        long_call = dict(call, prompt=BATCH_PROMPTS[0], num_inference_steps=4)
        short_call = dict(call, prompt=BATCH_PROMPTS[1], num_inference_steps=2, **self.staggered_short)
        self.assert_staggered_matches(ours, expected, long_call, short_call)

    def test_forward_returns_the_decoded_output(self, ours, expected, call):
        # The payload is the float output in uint8: within one level of rounding.
        call = dict(call, **self.alone_overrides)
        want = expected(call, self.alone_seed)
        (payload,) = ours.forward([self.request(call, self.alone_seed)])
        if ours.output_modality == "video":
            assert isinstance(payload, VideoPayload) and payload.fps == ours.default_params["fps"]
            got = payload.frames
        else:
            assert isinstance(payload, ImagePayload)
            got = np.stack([np.asarray(image) for image in payload.images])
        assert got.dtype == np.uint8 and got.shape == want.shape
        assert np.abs(got / 255 - want).max() <= 1 / 255 + 1e-6

    def test_input_images_are_checked(self, ours):
        # Text-to-X pipelines refuse an input image; image-conditioned ones need one.
        assert_rejected(ours, "image", images=[] if ours.needs_image else [default_input_image()])


class BatchSeededParityTests(ParityTests):
    """ParityTests whose alone, forward and staggered tests use the batch test's prompts and seeds,
    so the class's cached reference outputs serve them all (for families with a slow reference)."""

    alone_overrides = {"prompt": BATCH_PROMPTS[0]}
    alone_seed = BATCH_SEEDS[0]
    staggered_seeds = (BATCH_SEEDS[0], BATCH_SEEDS[1])
