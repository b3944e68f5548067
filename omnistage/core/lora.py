"""LoRA adapters by name and path: what a request names (`LoraRequest`), and the set of adapters
one engine serves and which of them its model holds (`LoraSet`), for diffusion and AR stages alike.

NOTE on the algorithm: the adapters of the deploy file's `lora_adapters` are loaded at
start-up and stay. An adapter named with a path (a request's `lora: {name, path}`, or
`POST /v1/lora_adapters`) is remembered by name and loaded on first use into an LRU set of
at most `max_loras` adapters, shared by every request that names it. To make room, the
least recently used adapter that no unfinished request (queued or running) names is
unloaded; it stays known by name, so a later request naming it loads it again from its
path. When every slot holds an adapter in use, the request waits in the set's `waiting`
queue (`take_slot`) until one frees (`admit_waiting`, each engine step): nothing is unloaded
under a request that uses it.

The engine process decides; the model loads and unloads what it is told (the `load` and
`unload` callables: a diffusion executor's `collective_rpc`, so all ranks hold the same set; the
AR engine's adapter table, ar/lora.py). A load that fails is undone and names `lora.path`.
What a path must be is the engine's (`check_path`): a diffusers LoRA file for a diffusion stage,
a peft adapter folder for an AR one.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Collection
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from omnistage.core.errors import RequestError


class LoraRequest(BaseModel):
    """A LoRA adapter by name: one the stage serves (deploy `lora_adapters`, or one loaded by path
    before), or a new one with its `path`, loaded on first use (deploy `max_loras`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    path: str | None = Field(default=None, min_length=1)
    """Where the adapter is on the server (a diffusion stage: a diffusers safetensors file; an AR
    stage: a peft adapter folder), loaded under `name` if the stage does not hold it yet; the
    engine drops it once resolved, so requests batch by name and scale."""
    scale: float = Field(default=1.0, ge=-8, le=8)
    """Multiplies the adapter's delta; 0 gives the base model."""


def unknown_adapter(name: str, served: Collection[str], field: str = "lora.name") -> RequestError:
    listed = ", ".join(sorted(served)) or "none (no lora_adapters in the deploy config)"
    return RequestError(field, f"{field}: unknown adapter {name!r}; this model serves: {listed}")


def _error(field: str, key: str, message: str) -> RequestError:
    """A refusal naming a request's `lora.path` (field "lora"), or a route body's `path` (field "")."""
    param = f"{field}.{key}" if field else key
    return RequestError(param, f"{param}: {message}")


class LoraSet:
    def __init__(self, declared: dict[str, str], max_loras: int, load: Callable[[str, str], str | None],
                 unload: Callable[[str], None], check_path: Callable[[str], str | None]):
        self.declared = dict(declared)
        self.max_loras = max_loras
        self._load = load
        self._unload = unload
        self._check_path = check_path
        """Why a path cannot hold an adapter for this engine (no such file or folder), or None."""
        self.waiting: list[tuple[Any, str, str]] = []
        """(request, adapter name, path) of the requests waiting for a free slot, in arrival order."""
        self.paths: dict[str, str] = {}
        """Adapters loaded by path, loaded now or not, by name."""
        self.loaded: OrderedDict[str, None] = OrderedDict()
        """Adapters loaded by path that the workers hold, least recently used first."""

    def names(self) -> list[str]:
        return sorted({*self.declared, *self.paths})

    def resolve(self, lora: LoraRequest, field: str = "lora") -> tuple[LoraRequest, str | None]:
        """(the request's adapter by name and scale only, the path to load it from: None for a
        deploy-declared one). RequestError naming `{field}.name` or `{field}.path`; loads nothing."""
        name, path = lora.name, lora.path
        bare = LoraRequest(name=name, scale=lora.scale)
        if name in self.declared:
            if path is not None and path != self.declared[name]:
                raise _error(field, "path", f"adapter {name!r} is the deploy config's (from {self.declared[name]}); "
                                            f"give another name")
            return bare, None
        if path is None:
            if name not in self.paths:
                raise unknown_adapter(name, self.names(), f"{field}.name" if field else "name")
            return bare, self.paths[name]
        if not self.max_loras:
            raise _error(field, "path", "this stage loads no adapter by path (deploy max_loras: 0)")
        known = self.paths.get(name)
        if known is not None and known != path:
            raise _error(field, "path", f"adapter {name!r} is loaded from {known}; unload it first "
                                        f"(DELETE /v1/lora_adapters/{name}) or give another name")
        problem = self._check_path(path)
        if problem is not None:
            raise _error(field, "path", problem)
        return bare, path

    def acquire(self, name: str, path: str, in_use: Collection[str], field: str = "lora") -> bool:
        """Make sure the workers hold adapter `name` (from `path`), unloading the least recently
        used one not `in_use` if the set is full (once the new one loaded: for a moment the model
        holds one adapter more). False: every slot holds an adapter in use, try
        again once one frees. RequestError naming `{field}.path` if the file does not load."""
        if name in self.loaded:
            self.loaded.move_to_end(name)
            return True
        known = self.paths.get(name)
        if known is not None and known != path:  # two requests raced to bring one name from two files
            raise _error(field, "path", f"adapter {name!r} is loaded from {known}")
        cold = None
        if len(self.loaded) >= self.max_loras:
            cold = next((n for n in self.loaded if n not in in_use), None)
            if cold is None:
                return False
        problem = self._load(name, path)  # first: a file that does not load leaves the set as it was
        if problem is not None:
            raise _error(field, "path", problem)
        if cold is not None:
            self._unload(cold)
            del self.loaded[cold]
        self.paths[name] = path
        self.loaded[name] = None
        return True

    def load_now(self, name: str, path: str, in_use: Collection[str]) -> None:
        """Load adapter `name` from `path` now (POST /v1/lora_adapters). RequestError naming `path`
        (a bad file, loads nothing) or `name`; RuntimeError when every slot holds an adapter in use."""
        _, lora_path = self.resolve(LoraRequest(name=name, path=path), field="")
        if lora_path is not None and not self.acquire(name, lora_path, in_use, field=""):
            raise RuntimeError(f"every one of the max_loras={self.max_loras} adapter slots holds an adapter "
                               f"a queued or running request uses; try again when one ends")

    def take_slot(self, request: Any, name: str, path: str, in_use: Collection[str]) -> bool:
        """Whether adapter `name` is loaded for a new `request` now; False: it waits in `waiting`
        (one that needs a slot does not jump the requests already waiting for one)."""
        if (not self.waiting or name in self.loaded) and self.acquire(name, path, in_use):
            return True
        self.waiting.append((request, name, path))
        return False

    def admit_waiting(self, in_use: Callable[[], Collection[str]], admit: Callable[[Any], None]
                      ) -> list[tuple[Any, RequestError]]:
        """`admit` the waiting requests whose adapter now has a slot, in arrival order; returns the
        (request, error) of those whose file did not load."""
        refused = []
        while self.waiting:
            request, name, path = self.waiting[0]
            try:
                if not self.acquire(name, path, in_use()):
                    break
                admit(request)
            except RequestError as e:
                refused.append((request, e))
            self.waiting.pop(0)
        return refused

    def drop_waiting(self, request_id: str) -> list[Any]:
        """Take the waiting request `request_id` out of the queue (an abort); returns it ([] if none)."""
        dropped = [r for r, _, _ in self.waiting if r.request_id == request_id]
        self.waiting = [w for w in self.waiting if w[0].request_id != request_id]
        return dropped

    def forget(self, name: str, in_use: Collection[str]) -> None:
        """Unload adapter `name` and forget its path (DELETE /v1/lora_adapters/{name}).
        RequestError naming `name` for a deploy-declared or unknown one; RuntimeError while a
        request uses it."""
        if name in self.declared:
            raise RequestError("name", f"name: adapter {name!r} is the deploy config's (lora_adapters); it stays")
        if name not in self.paths:
            raise unknown_adapter(name, self.names(), "name")
        if name in in_use:
            raise RuntimeError(f"adapter {name!r} is in use by a queued or running request; try again when it ends")
        if name in self.loaded:
            self._unload(name)
            del self.loaded[name]
        del self.paths[name]

    def describe(self) -> list[dict]:
        """Every adapter this engine serves: its name, path, whether it is loaded now, and where
        it came from ("deploy": `lora_adapters`, loaded for good; "path": loaded by path)."""
        declared = [{"name": n, "path": p, "loaded": True, "source": "deploy"} for n, p in self.declared.items()]
        hot = [{"name": n, "path": p, "loaded": n in self.loaded, "source": "path"} for n, p in self.paths.items()]
        return sorted(declared + hot, key=lambda a: a["name"])


def short_error(exc: BaseException) -> str:
    """An exception's first two lines: torch lists every mismatched tensor, one a line."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    more = f" (and {len(lines) - 2} more)" if len(lines) > 2 else ""
    return f"{type(exc).__name__}: {' '.join(lines[:2])}{more}"
