"""The LoRA adapters one diffusion engine serves, and which of them its workers hold.

NOTE on the algorithm: the adapters of the deploy file's `lora_adapters` are loaded at
start-up and stay. An adapter named with a path (a request's `lora: {name, path}`, or
`POST /v1/lora_adapters`) is remembered by name and loaded on first use into an LRU set of
at most `max_loras` adapters, shared by every request that names it. To make room, the
least recently used adapter that no unfinished request (queued or running) names is
unloaded; it stays known by name, so a later request naming it loads it again from its
path. When every slot holds an adapter in use, `acquire` says so and the engine keeps the
request waiting until one frees: nothing is unloaded under a request that uses it.

The engine process decides; every worker rank loads and unloads what it is told (the
`load` and `unload` callables: the executor's `collective_rpc`), so all ranks hold the
same set. A load that fails on any rank is undone on all of them and names `lora.path`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Collection
from pathlib import Path

from omnistage.core.errors import RequestError
from omnistage.diffusion.params import LoraRequest


def unknown_adapter(name: str, served: Collection[str], field: str = "lora.name") -> RequestError:
    listed = ", ".join(sorted(served)) or "none (no lora_adapters in the deploy config)"
    return RequestError(field, f"{field}: unknown adapter {name!r}; this model serves: {listed}")


def _error(field: str, key: str, message: str) -> RequestError:
    """A refusal naming a request's `lora.path` (field "lora"), or a route body's `path` (field "")."""
    param = f"{field}.{key}" if field else key
    return RequestError(param, f"{param}: {message}")


class LoraSet:
    def __init__(self, declared: dict[str, str], max_loras: int, load: Callable[[str, str], str | None],
                 unload: Callable[[str], None]):
        self.declared = dict(declared)
        self.max_loras = max_loras
        self._load = load
        self._unload = unload
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
        if not Path(path).is_file():
            raise _error(field, "path", f"no LoRA file {path!r} on the server")
        return bare, path

    def acquire(self, name: str, path: str, in_use: Collection[str], field: str = "lora") -> bool:
        """Make sure the workers hold adapter `name` (from `path`), unloading the least recently
        used one not `in_use` if the set is full. False: every slot holds an adapter in use, try
        again once one frees. RequestError naming `{field}.path` if the file does not load."""
        if name in self.loaded:
            self.loaded.move_to_end(name)
            return True
        known = self.paths.get(name)
        if known is not None and known != path:  # two requests raced to bring one name from two files
            raise _error(field, "path", f"adapter {name!r} is loaded from {known}")
        if len(self.loaded) >= self.max_loras:
            cold = next((n for n in self.loaded if n not in in_use), None)
            if cold is None:
                return False
            self._unload(cold)
            del self.loaded[cold]
        problem = self._load(name, path)
        if problem is not None:
            raise _error(field, "path", problem)
        self.paths[name] = path
        self.loaded[name] = None
        return True

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
