"""Deploy fields: the knobs a user may set in a deploy file.

`StageDeployConfig` holds one stage's fields, `PipelineDeployConfig` the pipeline-wide
ones. Every field is documented; its range or choices sit in the CONSTRAINTS table
below its class. `config/deploy.py` loads YAML and merges layers into these types;
engines read them. Constructing either type validates it and raises one `ValueError`
listing every problem.
"""

from __future__ import annotations

import math
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from omnistage.config.validation import at_least, check_fields, format_problems, one_of


@dataclass(frozen=True)
class StageDeployConfig:
    runtime: str = "inline"
    """Where the orchestrator runs this stage's engine: "inline" | "process" | "ray"."""
    devices: tuple[str, ...] = ()
    """Devices for this stage, e.g. ("cuda:0", "cuda:1"); empty = the platform default (cuda:0 or cpu). Every
    copy of a replicated stage runs on them; replica_devices gives each copy its own."""
    dtype: str = "auto"
    """"auto" (bf16 on GPU, fp32 on CPU) | "float32" | "bfloat16" | "float16"."""
    max_num_seqs: int = 1
    """Most requests one batch may hold."""
    request_batch_max_wait_ms: float = 0.0
    """How long the scheduler waits for more requests to coalesce a burst into one batch."""
    step_execution: bool = False
    """Diffusion: step-level continuous batching (requests join/leave between denoising steps, so a
    short request does not wait behind a long one). The default is per family: each declares it in
    its StageSpec.defaults, step mode where it measured within 5% of request mode's throughput
    (benchmarks/RESULTS.md "Step mode vs request mode"); False for pipelines that declare none."""
    executor: str = "uni"
    """Worker executor: "uni" (in-process) | "mp" (one process per device) | "ray"."""
    num_devices: int = 1
    """Number of devices (worker ranks) for this stage."""
    cfg_parallel_size: int = 1
    """Diffusion: 2 runs the cond and uncond branches of classifier-free guidance on two ranks. The
    parallel degrees multiply to num_devices."""
    ulysses_degree: int = 1
    """Diffusion: ranks the token sequence is split over, heads exchanged all-to-all (Ulysses); it must
    divide the attention heads."""
    ring_degree: int = 1
    """Diffusion: ranks of ring attention over key/value chunks; combines with ulysses_degree."""
    tensor_parallel_size: int = 1
    """AR (vllm): vLLM's tensor parallel size. Diffusion: ranks the transformer blocks' attention and MLP
    weights (and a block's own modulation) are sharded over, for the families that declare a plan; others
    refuse it."""
    fsdp_degree: int = 1
    """Diffusion: ranks the transformer's weights are sharded over (torch FSDP2: each rank keeps ~1/N of
    every parameter, gathered a block at a time as it runs); they all run the same work, for a model that
    does not fit one device. For the families that declare it; others refuse it."""
    vae_patch_parallel_size: int = 1
    """Diffusion: ranks that decode the VAE's tiles (and encode an input image's) in parallel and gather them
    (at most num_devices)."""
    vae_use_tiling: bool = False
    """Diffusion: decode and encode through the diffusers VAE's own tiling (less memory, more time)."""
    vae_use_slicing: bool = False
    """Diffusion: decode (and encode) a batch through the VAE one sample at a time (diffusers' slicing: the
    VAE's activations of one sample, not of the batch; the same output). Off by default, as in diffusers."""
    cache_backend: str | None = None
    """Diffusion step cache: None | "tea_cache" | "first_block_cache" | "easycache" | "mag_cache" | "cache_dit"."""
    cache_config: dict[str, Any] = field(default_factory=dict)
    """Options of cache_backend, e.g. {threshold: 0.05} for first_block_cache; an unknown key or a bad
    value is refused at start-up naming cache_config.<key>."""
    offload: str | None = None
    """Diffusion: None | "model" (one component on the device at a time) | "layerwise" (transformer
    blocks copied to the device a group at a time, the next prefetched)."""
    offload_blocks_per_group: int = 1
    """With `offload: layerwise`: transformer blocks per group copied to the device together."""
    quantization: str | None = None
    """Diffusion: the transformer's linear layers; AR (native): the model's. None | "int8" | "fp8" (weight-only) |
    "int8_dynamic" (activations too, per token) | "fp8_dynamic" (CUDA, compute capability 8.9+)."""
    ignored_layers: tuple[str, ...] = ()
    """With `quantization`: layer-name patterns (fnmatch, e.g. "proj_out") kept in full precision."""
    transformer_file: str | None = None
    """Diffusion: a .gguf file of the transformer (quantized weights, through diffusers' GGUF loader) loaded
    in place of the folder's transformer, whose config it takes; SVDQuant (Nunchaku) files are refused."""
    lora: tuple[dict[str, Any], ...] | None = None
    """Diffusion: LoRA files fused into the weights at load: [{path, scale (default 1.0)}, ...]."""
    lora_adapters: dict[str, str] = field(default_factory=dict)
    """LoRA adapters loaded side by side, by name (diffusion: diffusers LoRA files; native AR: peft adapter
    folders); a request picks one with `lora: {name, scale}`."""
    max_loras: int = 0
    """Diffusion and native AR: most LoRA adapters loaded by path while serving (a request's `lora: {name, path}`, or
    `POST /v1/lora_adapters`), the least recently used one not in use unloaded to make room; 0 = no
    adapter may be loaded by path. The `lora_adapters` ones stay loaded and are not counted."""
    compile: bool = False
    """Diffusion: regional torch.compile of the transformer's blocks. AR (native, CUDA only): decode
    steps replayed from CUDA graphs. AR (vllm): False = vLLM's enforce_eager."""
    prepack_linears: bool | None = None
    """CPU: linear layers run through oneDNN with their weights packed once at load (about 2x torch's
    matmul on a DiT's or a decode batch's rows; results differ by rounding only). None (the default): on
    for AR and audio-decoder stages, off for diffusion stages, where packed blocks make a request's image
    differ by rounding (one 8-bit level) with what it is batched with; True packs the diffusion
    transformer blocks too where nothing else wraps, shards, moves or quantizes them (LoRA,
    quantization, a GGUF transformer_file, tensor parallel, FSDP, offload and compile leave a diffusion
    stage unpacked). False keeps torch's own matmul everywhere. No effect on a GPU."""
    attention_backend: str = "sdpa"
    """Diffusion: one of diffusers' attention dispatcher backends ("sdpa", "sdpa_math", "flex",
    "flash_attn", "sage", "xformers", ...); an unknown or unavailable one is refused, listing those
    this machine can run."""
    max_model_len: int | None = None
    """AR: longest prompt + output in tokens; None = the model's max_position_embeddings."""
    ar_backend: str = "native"
    """AR: "native" | "vllm"."""
    kv_cache_memory: float | None = None
    """AR (native): KV-cache budget, bytes (> 1) or a fraction (<= 1) of the device's memory (host RAM
    on CPU); None = room for max_num_seqs sequences of max_model_len tokens."""
    enable_prefix_caching: bool = True
    """AR (native): reuse the cached KV blocks of a prompt's prefix computed by an earlier request; also
    for requests that hand hidden states to the next stage (omni thinkers), whose rows are stored with
    the blocks."""
    max_num_batched_tokens: int | None = None
    """AR (native): most tokens one step feeds (decodes + prompt chunks); longer prompts are prefilled
    in chunks beside the running decodes. None = 2048."""
    paged_attention: str = "auto"
    """AR (native): how attention reads the paged KV cache. "kernel": in place, block by block (a C++
    CPU kernel built on first use; on CUDA a Triton kernel, not yet run on a GPU by our tests),
    "gather": each sequence's blocks copied together, then SDPA; "auto": on CPU the kernel where it
    runs (a transformers LLM of plain causal attention, the kernel built), else gather; on CUDA gather
    until the Triton kernel has passed on a GPU ("kernel" opts in)."""
    default_sampling_params: dict[str, Any] = field(default_factory=dict)
    """Defaults for request params (SamplingParams or DiffusionParams fields) of this stage."""
    real_time_admission: bool = False
    """Off by default: on a quiet 2-core host it kept 0.56-0.69x of the audio per wall second of
    admission off on the tiny TTS models, for no stalls against ~55 ms p99 at 32 streams
    (benchmarks/RESULTS.md, "TTS under load"), and it also holds offline batches, which have no
    listener. On: a final stage streaming audio starts a new request only while every admitted stream
    is made at least 25% faster than real time (measured as it runs; before a rate is measured, while
    each leads its listener by 0.25 s) and none is behind its listener; the others wait in the queue,
    in order (their time to first audio grows; past `--max-queued-requests` the server answers 429).
    Off: every request starts at once and all streams share the capacity."""
    audio_capacity: float | None = None
    """A final stage streaming audio, with real_time_admission: the seconds of audio it makes per wall
    second in all, fixed (all the streams, with 25% to spare, must fit it); None = measured per stream."""
    env: dict[str, str] = field(default_factory=dict)
    """Environment for this stage's worker processes (process plumbing only)."""
    ray_address: str | None = None
    """Ray cluster for `runtime: ray` / `executor: ray` (e.g. "10.0.0.1:6379"); None = $RAY_ADDRESS,
    else the Ray this process already joined, else a local Ray started here."""
    ray_resources: dict[str, float] = field(default_factory=dict)
    """Ray resources for each actor of this stage (the stage actor with `runtime: ray`, each worker
    with `executor: ray`), e.g. {CPU: 2, GPU: 1, node_b: 1}; a custom resource pins the stage to the
    nodes started with it. Defaults: CPU 1, GPU 1 per rank on CUDA devices."""
    max_restarts: int = 5
    """Rebuild attempts after the stage dies, hangs or its engine panics, before it stays down
    (0: never restart; `serve --no-restart`)."""
    restart_backoff_s: float = 0.5
    """Wait before the first rebuild attempt; doubled after each failed one (at most 30 s)."""
    stage_timeout_s: float | None = None
    """A `runtime: process` or `ray` stage whose loop sends no heartbeat for this long is hung: /health
    turns 503, its requests fail with 503, and it is rebuilt (`serve --stage-timeout`). None: 10 times
    its slowest step so far, at least 120 s."""
    ray_placement_strategy: str = "PACK"
    """How a placement group spreads this stage's actors over nodes: the ranks of `executor: ray`, and
    the copies of a `runtime: ray` stage with num_replicas > 1: "PACK" | "SPREAD" | "STRICT_PACK" |
    "STRICT_SPREAD"."""
    num_replicas: int = 1
    """Copies of this stage, each a full engine: its own process with `runtime: process`, its own Ray
    actor with `runtime: ray` (each with the stage's ray_resources, and its devices or its own list of
    replica_devices). Each copy is supervised and rebuilt on its own; a request whose copy is killed or
    hangs before it sent any output is re-run on another. More than 1 needs runtime "process" or "ray"."""
    replica_devices: tuple[tuple[str, ...], ...] = ()
    """One device list per copy of a replicated stage, e.g. [[cuda:0], [cuda:1]], instead of `devices`
    (which every copy would share): copy i runs on list i, a copy added by autoscaling on the first
    list no running copy holds. It needs a list per copy (num_replicas, or max_replicas when set), each
    of num_devices devices. With `runtime: ray` Ray still picks the GPUs; a copy sees its list as
    Ray renumbers it (cuda:0 on)."""
    routing_policy: str = "least_outstanding"
    """Which replica takes a new request: "least_outstanding" (least work queued or running there: the
    steps or tokens its requests ask for) | "round_robin" | "affinity" (the same session key, else the same prompt prefix, goes to the same
    replica while it serves, so it finds its cache)."""
    max_replicas: int | None = None
    """Autoscaling: most copies of this stage. Set (above `min_replicas`) to add copies while the
    requests outstanding per copy exceed `target_outstanding_per_replica` and remove them after
    `scale_down_delay_s` of less work; the stage starts with `num_replicas`. None: a fixed
    `num_replicas`. Needs runtime "process" or "ray" (a Ray copy added beyond the start takes a
    placement bundle a drained copy gave back, else a one-bundle placement group of its own)."""
    min_replicas: int = 1
    """Autoscaling: fewest copies; the stage never drains below this (needs `max_replicas`)."""
    target_outstanding_per_replica: float = 4.0
    """Autoscaling: requests queued or running per copy that the scaler aims for; above it copies are
    added at once (as many as the work needs, up to `max_replicas`)."""
    scale_down_delay_s: float = 60.0
    """Autoscaling cool-down: how long the work must have needed fewer copies before one is drained
    (it takes no new requests, finishes its own, then stops); the next one waits as long again."""

    def __post_init__(self) -> None:
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        converted, problems = check_fields(StageDeployConfig, values, STAGE_CONSTRAINTS)
        if not problems:
            problems = stage_consistency_problems(converted)
        if problems:
            raise ValueError(format_problems("invalid StageDeployConfig:", problems))
        # YAML hands us lists and ints; store the declared tuple/float types.
        for name, value in converted.items():
            object.__setattr__(self, name, value)


def _check_lora_entries(entries: tuple[dict[str, Any], ...]) -> str | None:
    for i, entry in enumerate(entries):
        if not isinstance(entry.get("path"), str) or set(entry) - {"path", "scale"}:
            return f"item {i}: expected {{path: string, scale: number}}, got {entry!r}"
        if not isinstance(entry.get("scale", 1.0), int | float) or isinstance(entry.get("scale"), bool):
            return f"item {i}: scale must be a number, got {entry['scale']!r}"
    return None


STAGE_FIELDS = tuple(f.name for f in fields(StageDeployConfig))

STAGE_CONSTRAINTS = {
    "runtime": one_of("inline", "process", "ray"),
    "dtype": one_of("auto", "float32", "bfloat16", "float16"),
    "max_num_seqs": at_least(1),
    "request_batch_max_wait_ms": at_least(0),
    "executor": one_of("uni", "mp", "ray"),
    "num_devices": at_least(1),
    "cfg_parallel_size": at_least(1),
    "ulysses_degree": at_least(1),
    "ring_degree": at_least(1),
    "tensor_parallel_size": at_least(1),
    "fsdp_degree": at_least(1),
    "vae_patch_parallel_size": at_least(1),
    "offload": one_of("model", "layerwise"),
    "offload_blocks_per_group": at_least(1),
    "max_model_len": at_least(1),
    "ar_backend": one_of("native", "vllm"),
    "kv_cache_memory": lambda v: None if v > 0 else f"must be > 0 (bytes, or a fraction of the device memory), got {v!r}",
    "max_num_batched_tokens": at_least(1),
    "audio_capacity": lambda v: None if v > 0 else f"must be > 0 audio seconds per wall second, got {v!r}",
    "paged_attention": one_of("auto", "kernel", "gather"),
    "lora": _check_lora_entries,
    "max_loras": at_least(0),
    "ray_resources": lambda v: next((f"{k}: must be >= 0, got {n!r}" for k, n in v.items() if n < 0), None),
    "max_restarts": at_least(0),
    "restart_backoff_s": at_least(0),
    "stage_timeout_s": lambda v: None if v > 0 else f"must be > 0 seconds, got {v!r}",
    "ray_placement_strategy": one_of("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"),
    "num_replicas": at_least(1),
    "routing_policy": one_of("least_outstanding", "round_robin", "affinity"),
    "max_replicas": at_least(1),
    "min_replicas": at_least(1),
    "target_outstanding_per_replica": lambda v: None if v > 0 else f"must be > 0, got {v!r}",
    "scale_down_delay_s": at_least(0),
    # cache_backend, quantization and attention_backend are open sets: the registries
    # that implement them (diffusion/cache, quant.py, attention.py) own the valid names.
}

# Mapping fields whose keys are independent settings: layers merge them key by key
# (a platform overlay adds one sampling default without restating the others). The
# other mapping fields (cache_config, lora_adapters) belong to the backend or adapter named
# beside them, so a layer that sets them replaces them whole.
MERGED_MAPPING_FIELDS = ("default_sampling_params", "env")

PARALLEL_DEGREES = ("cfg_parallel_size", "ulysses_degree", "ring_degree", "tensor_parallel_size", "fsdp_degree")


def stage_consistency_problems(values: dict[str, Any]) -> list[str]:
    """Rules across fields of one stage (each field alone is already valid).

    NOTE: every worker rank holds exactly one cell of the parallel mesh (CFG branch x
    Ulysses x ring x tensor shard x FSDP shard), so the product of the degrees must equal the number
    of devices: fewer devices cannot hold the mesh, more would sit idle. VAE patch
    parallelism reuses those ranks after denoising, so it only needs to fit in them.
    """
    v = {**_STAGE_DEFAULTS, **values}
    problems = []
    num_devices = v["num_devices"]
    degrees = {name: v[name] for name in PARALLEL_DEGREES}
    product = math.prod(degrees.values())
    if product != num_devices:
        terms = " * ".join(f"{name}={value}" for name, value in degrees.items())
        problems.append(f"parallel degrees: {terms} = {product}, but num_devices={num_devices}")
    if v["vae_patch_parallel_size"] > num_devices:
        problems.append(f"vae_patch_parallel_size={v['vae_patch_parallel_size']} is more than num_devices={num_devices}")
    if v["devices"] and len(v["devices"]) != num_devices:
        problems.append(
            f"devices lists {len(v['devices'])} device(s) {list(v['devices'])}, but num_devices={num_devices}"
        )
    if v["executor"] == "uni" and num_devices > 1:
        problems.append(f"executor 'uni' runs one in-process worker; num_devices={num_devices} needs 'mp' or 'ray'")
    if v["num_replicas"] > 1 and v["runtime"] == "inline":
        # Inline engines share the orchestrator's thread: copies would add memory, not throughput.
        problems.append(f"num_replicas={v['num_replicas']} needs runtime 'process' or 'ray'; runtime 'inline' "
                        f"runs one engine in the orchestrator's thread")
    if v["replica_devices"]:
        problems.extend(replica_devices_problems(v))
    if v["max_replicas"] is not None:
        if not v["min_replicas"] <= v["num_replicas"] <= v["max_replicas"]:
            problems.append(f"autoscaling needs min_replicas <= num_replicas <= max_replicas, got "
                            f"min_replicas={v['min_replicas']}, num_replicas={v['num_replicas']}, "
                            f"max_replicas={v['max_replicas']}")
        if v["runtime"] == "inline":
            problems.append(f"max_replicas={v['max_replicas']} (autoscaling) needs runtime 'process' or 'ray', "
                            f"got runtime 'inline'")
    elif v["min_replicas"] != 1:
        problems.append(f"min_replicas={v['min_replicas']} needs max_replicas (autoscaling); a fixed stage "
                        f"has num_replicas copies")
    return problems


def replica_devices_problems(v: dict[str, Any]) -> list[str]:
    """`replica_devices` against the fields it must agree with (it is set)."""
    lists = v["replica_devices"]
    copies = v["num_replicas"] if v["max_replicas"] is None else v["max_replicas"]
    problems = []
    if v["devices"]:
        problems.append(f"replica_devices and devices are both set: give each copy its list in replica_devices "
                        f"and leave devices empty (devices={list(v['devices'])} would be shared by every copy)")
    if v["runtime"] == "inline":
        problems.append("replica_devices needs runtime 'process' or 'ray'; runtime 'inline' runs one engine")
    elif copies == 1:
        problems.append("replica_devices gives each copy of a replicated stage its devices; this stage has one "
                        "copy (num_replicas=1, no max_replicas): set devices instead")
    elif len(lists) < copies:
        need = f"num_replicas={copies}" if v["max_replicas"] is None else f"max_replicas={copies}"
        problems.append(f"replica_devices lists {len(lists)} device list(s), but {need} needs one per copy")
    for i, devices in enumerate(lists):
        if len(devices) != v["num_devices"]:
            problems.append(f"replica_devices item {i} lists {len(devices)} device(s) {list(devices)}, but "
                            f"num_devices={v['num_devices']}")
    return problems


@dataclass(frozen=True)
class PipelineDeployConfig:
    """Pipeline-wide deploy fields (the top level of a deploy file, outside `stages:`)."""

    connector: str = "inline"
    """How payloads travel between stages: "inline" (object passed in-process) | "shm" | "ray"."""
    shm_threshold_bytes: int = 65536
    """With the shm or ray connector: payloads at least this large go through shared memory (the Ray
    object store), smaller ones inline."""
    output_modalities: tuple[str, ...] | None = None
    """Modalities to return, e.g. ["text"]; None = all the pipeline produces. A pipeline resolver may
    pick a smaller variant from it (e.g. an omni model without its audio stages)."""

    def __post_init__(self) -> None:
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        converted, problems = check_fields(PipelineDeployConfig, values, PIPELINE_CONSTRAINTS)
        if problems:
            raise ValueError(format_problems("invalid PipelineDeployConfig:", problems))
        for name, value in converted.items():
            object.__setattr__(self, name, value)


def _check_modalities(value: tuple[str, ...]) -> str | None:
    # Imported here: spec.py imports this module for the stage field names.
    from omnistage.config.spec import MODALITIES

    bad = [m for m in value if m not in MODALITIES]
    return f"{bad} not in {'|'.join(MODALITIES)}" if bad else None


PIPELINE_FIELDS = tuple(f.name for f in fields(PipelineDeployConfig))

PIPELINE_CONSTRAINTS = {
    "connector": one_of("inline", "shm", "ray"),
    "shm_threshold_bytes": at_least(0),
    "output_modalities": _check_modalities,
}

_STAGE_DEFAULTS = {
    f.name: f.default if f.default_factory is MISSING else f.default_factory()
    for f in fields(StageDeployConfig)
}


KIND_ONLY_FIELDS: dict[str, tuple[str, ...]] = {
    "diffusion": ("step_execution", "cfg_parallel_size", "ulysses_degree", "ring_degree", "fsdp_degree",
                  "vae_patch_parallel_size", "vae_use_tiling", "vae_use_slicing", "cache_backend", "cache_config",
                  "offload_blocks_per_group", "transformer_file"),
    "ar": ("max_model_len", "ar_backend", "kv_cache_memory", "enable_prefix_caching", "max_num_batched_tokens",
           "paged_attention"),
}
"""Deploy fields only one stage kind reads; every other field applies to all kinds."""
