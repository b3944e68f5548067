"""Per-stage deploy fields: the knobs a user may set for one stage in a deploy file.

One dataclass, every field documented. `config/deploy.py` loads YAML, merges layers and
validates into this type; engines read it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any


@dataclass(frozen=True)
class StageDeployConfig:
    runtime: str = "inline"
    """Where the orchestrator runs this stage's engine: "inline" | "process" | "ray"."""
    devices: tuple[str, ...] = ()
    """Devices for this stage, e.g. ("cuda:0", "cuda:1"); empty = the platform default (cuda:0 or cpu)."""
    dtype: str = "auto"
    """"auto" (bf16 on GPU, fp32 on CPU) | "float32" | "bfloat16" | "float16"."""
    max_num_seqs: int = 1
    """Most requests one batch may hold."""
    request_batch_max_wait_ms: float = 0.0
    """How long the scheduler waits for more requests to coalesce a burst into one batch."""
    step_execution: bool = False
    """Diffusion: step-level continuous batching (requests join/leave between denoising steps)."""
    executor: str = "uni"
    """Worker executor: "uni" (in-process) | "mp" (one process per device) | "ray"."""
    num_devices: int = 1
    """Number of devices (worker ranks) for this stage."""
    cfg_parallel_size: int = 1
    ulysses_degree: int = 1
    ring_degree: int = 1
    tensor_parallel_size: int = 1
    vae_patch_parallel_size: int = 1
    vae_use_tiling: bool = False
    cache_backend: str | None = None
    """Diffusion step cache: None | "tea_cache" | "first_block_cache" | ..."""
    cache_config: dict[str, Any] = field(default_factory=dict)
    offload: str | None = None
    """None | "model" | "sequential"."""
    quantization: str | None = None
    lora: dict[str, Any] | None = None
    compile: bool = False
    attention_backend: str = "sdpa"
    max_model_len: int | None = None
    """AR: longest prompt + output in tokens; None = the model's max_position_embeddings."""
    ar_backend: str = "native"
    """AR: "native" | "vllm"."""
    default_sampling_params: dict[str, Any] = field(default_factory=dict)
    """Defaults for request params (SamplingParams or DiffusionParams fields) of this stage."""
    env: dict[str, str] = field(default_factory=dict)
    """Environment for this stage's worker processes (process plumbing only)."""


STAGE_FIELDS = tuple(f.name for f in fields(StageDeployConfig))
