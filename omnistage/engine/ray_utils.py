"""Ray plumbing shared by the Ray executor (diffusion/executor/ray.py), the Ray stage runtime
(ray_stage.py) and the Ray connector: import Ray with an error that says how to install it,
join (or start) the cluster once per process, the environment actors get, actor resources,
placement groups, and a short description of an actor's death.

Ray is optional (`pip install 'omnistage[ray]'`); nothing imports it until a deploy file
asks for it.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from omnistage.config.deploy_fields import StageDeployConfig

PROPAGATED_ENV = ("PYTHONPATH",)
"""Variables of this process that every actor gets: on a local cluster `ray start` may have
been run from another shell, and the actors must import the same omnistage."""

PLACEMENT_TIMEOUT_S = 60.0


def import_ray() -> Any:
    try:
        import ray
    except ImportError as e:
        raise ImportError("runtime/executor/connector 'ray' needs Ray, which is not installed: "
                          "pip install 'omnistage[ray]'") from e
    return ray


def ensure_ray(address: str | None = None) -> str:
    """Join the Ray cluster at `address` (None: $RAY_ADDRESS, else a running local cluster,
    else a new local one) unless this process already joined one; return its GCS address,
    which another process can join with the same call."""
    ray = import_ray()
    if not ray.is_initialized():
        ray.init(address=address or os.environ.get("RAY_ADDRESS") or None, include_dashboard=False,
                 runtime_env={"env_vars": propagated_env()}, configure_logging=False)
    return ray.get_runtime_context().gcs_address


def propagated_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The env_vars of an actor's runtime_env: PROPAGATED_ENV from here, then the stage's `env`."""
    env = {name: os.environ[name] for name in PROPAGATED_ENV if os.environ.get(name)}
    env.update(extra or {})
    return env


def runtime_env(stage_env: dict[str, str]) -> dict[str, Any]:
    """The `runtime_env` option of a stage's actor: none when the stage sets no `env` (the job's
    own, from ensure_ray, lets Ray reuse its prestarted workers), else the job's plus the stage's."""
    return {"runtime_env": {"env_vars": propagated_env(stage_env)}} if stage_env else {}


def use_reserved_cpus(config: StageDeployConfig) -> None:
    """Inside an actor: as many torch threads as the CPUs it reserved (`ray_resources` CPU, default
    1), whatever OMP_NUM_THREADS the Ray worker process was started with."""
    import torch

    torch.set_num_threads(max(1, int(config.ray_resources.get("CPU", 1))))


def wants_gpu(devices: tuple[str, ...], cluster_gpus: float) -> bool:
    """Whether a stage's actor asks Ray for a GPU: it lists a CUDA device, or it lists none (the
    platform default) and the cluster has GPUs. The driver's own CUDA does not matter: a Ray
    head often has none."""
    if devices:
        return any(device.startswith("cuda") for device in devices)
    return cluster_gpus > 0


def devices_in_actor(devices: tuple[str, ...], num_devices: int, gpu: bool) -> tuple[str, ...]:
    """The stage's `devices` as its actor sees them: Ray makes the GPUs it assigned visible as
    cuda:0, cuda:1, ... so CUDA devices are renumbered in order of first mention; with none
    listed and a GPU wanted, cuda:0 onwards. CPU entries stay."""
    if not gpu:
        return tuple(devices)
    if not devices:
        return tuple(f"cuda:{i}" for i in range(num_devices))
    order: dict[str, int] = {}
    return tuple(f"cuda:{order.setdefault(d, len(order))}" if d.startswith("cuda") else d for d in devices)


def actor_resources(config: StageDeployConfig, cuda: bool) -> dict[str, Any]:
    """`num_cpus`, `num_gpus` and custom `resources` of one actor of this stage: `ray_resources`
    with CPU 1 (and GPU 1 on CUDA) by default."""
    custom = dict(config.ray_resources)
    return {"num_cpus": custom.pop("CPU", 1.0), "num_gpus": custom.pop("GPU", 1.0 if cuda else 0.0),
            "resources": custom}


def bundle(resources: dict[str, Any]) -> dict[str, float]:
    """The placement-group bundle that holds one actor with `resources` (from actor_resources)."""
    out = {"CPU": resources["num_cpus"], **resources["resources"]}
    if resources["num_gpus"]:
        out["GPU"] = resources["num_gpus"]
    return {name: amount for name, amount in out.items() if amount}


def check_placeable(bundle_: dict[str, float], what: str) -> None:
    """ValueError naming the resources when no live node of the cluster offers all of `bundle_`
    (else Ray would wait for such a node forever)."""
    ray = import_ray()
    nodes = [node["Resources"] for node in ray.nodes() if node["Alive"]]
    if not any(all(node.get(name, 0) >= amount for name, amount in bundle_.items()) for node in nodes):
        raise ValueError(f"{what}: ray_resources: no node of the Ray cluster offers {bundle_} (its nodes offer "
                         f"{[{k: v for k, v in node.items() if not k.startswith('node:')} for node in nodes]})")


def reserve(bundles: list[dict[str, float]], strategy: str, what: str, timeout_s: float = PLACEMENT_TIMEOUT_S) -> Any:
    """A ready placement group of `bundles`; RuntimeError naming what the cluster lacks when it
    cannot be placed within `timeout_s`."""
    ray = import_ray()
    from ray.util.placement_group import placement_group, remove_placement_group

    group = placement_group(bundles, strategy=strategy)
    try:
        ray.get(group.ready(), timeout=timeout_s)
    except Exception as e:
        remove_placement_group(group)
        if isinstance(e, ray.exceptions.GetTimeoutError):
            raise RuntimeError(f"{what}: Ray cannot place {bundles} ({strategy}) within {timeout_s:.0f} s; the "
                               f"cluster has {ray.cluster_resources()} (set ray_resources to what its nodes "
                               f"offer)") from None
        raise
    return group


def release(group: Any) -> None:
    """Remove a placement group; safe when Ray is already shut down."""
    ray = import_ray()
    if group is None or not ray.is_initialized():
        return
    from ray.util.placement_group import remove_placement_group

    try:
        remove_placement_group(group)
    except Exception:  # noqa: BLE001 - already gone with its cluster
        pass


def kill(actor: Any) -> None:
    """Kill an actor (no restart); safe when it or Ray is already gone."""
    ray = import_ray()
    if actor is None or not ray.is_initialized():
        return
    try:
        ray.kill(actor, no_restart=True)
    except Exception:  # noqa: BLE001
        pass


def is_actor_death(e: BaseException) -> bool:
    ray = import_ray()
    return isinstance(e, ray.exceptions.RayActorError | ray.exceptions.ActorUnavailableError)


def death_reason(e: BaseException) -> str:
    """The first line of Ray's long actor-death message."""
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__
