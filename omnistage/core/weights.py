"""Weights replaced in place: a stage takes new weights without a restart, or drops its own
and reads them back (sleep level 2).

- `read_checkpoint(folder, components)`: a checkpoint's tensors by name, read with
  safetensors: the `*.safetensors` files of the folder itself (a transformers checkpoint,
  sharded or not), or, for each named component, of its subfolder, keyed
  `"{component}.{name}"` (a diffusers pipeline folder).
- `load_weights(modules, tensors)`: copy `tensors` into the modules' parameters and buffers
  by state-dict name (`"{module key}.{name}"` when `modules` is a dict). Every name and
  shape is checked before anything is copied, so a bad checkpoint changes nothing. Tensors
  are copied into the ones there (`copy_`): modules, hooks and tied weights keep pointing at
  the same objects, and the dtype and device stay the stage's.
- `Dropped(modules, names)`: frees the storage of the named tensors (shape, dtype and
  device kept); `restore(tensors)` allocates them again and copies the tensors in.

A module whose weights were transformed at load (e.g. `PrepackedLinear`) offers
`weight_shapes` (name -> the shape a checkpoint holds), `load_weight(name, tensor)` and
`drop_weight(name) -> bytes freed`, and takes (and frees) its named weights through them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

MAX_NAMED = 5
"""How many unknown or mismatched names an error lists."""
NO_FOLDER = ("sleep level 2 reads the weights back from a checkpoint folder, and this stage has none (loaded "
             "from a hub id, or updated from tensors): sleep at level 1, or update from a checkpoint folder")


def weights_folder(model_path: str) -> str | None:
    """`model_path` when it is a local folder (sleep level 2 can read it back), else None."""
    return model_path if Path(model_path).expanduser().is_dir() else None


def read_checkpoint(folder: str | Path, components: Iterable[str] | None = None) -> dict[str, torch.Tensor]:
    """The tensors of `folder` (see the module docstring); ValueError naming `folder` when it holds none."""
    from safetensors.torch import load_file

    root = Path(folder).expanduser()
    if not root.is_dir():
        raise ValueError(f"checkpoint {str(folder)!r} is not a folder")
    places = [("", root)] if components is None else [(f"{c}.", root / c) for c in components if (root / c).is_dir()]
    tensors: dict[str, torch.Tensor] = {}
    for prefix, place in places:
        for file in sorted(place.glob("*.safetensors")):
            tensors.update({prefix + name: t for name, t in load_file(str(file)).items()})
    if not tensors:
        where = "" if components is None else f" (nor in its component folders {sorted(components)})"
        raise ValueError(f"checkpoint {str(folder)!r} has no *.safetensors files{where}")
    return tensors


def checkpoint_names(folder: str | Path, components: Iterable[str] | None = None) -> list[str]:
    """The names `read_checkpoint` would return, read from the files' headers only."""
    from safetensors import safe_open

    root = Path(folder).expanduser()
    places = [("", root)] if components is None else [(f"{c}.", root / c) for c in components if (root / c).is_dir()]
    names = []
    for prefix, place in places:
        for file in sorted(place.glob("*.safetensors")):
            with safe_open(str(file), "pt") as f:
                names += [prefix + name for name in f.keys()]
    return names


def _targets(modules: Mapping[str, Any] | Any) -> tuple[dict[str, Any], dict[str, tuple[Any, str]]]:
    """Name -> tensor (state dict, tied names included) and name -> (module, its own name, the shape
    it takes) for modules that load their transformed weights themselves."""
    named = modules.items() if isinstance(modules, Mapping) else [("", modules)]
    tensors, custom = {}, {}
    for key, module in named:
        prefix = f"{key}." if key else ""
        tensors.update({prefix + name: t for name, t in module.state_dict(keep_vars=True).items()})
        for path, sub in module.named_modules():
            for name, shape in getattr(sub, "weight_shapes", {}).items():
                custom[f"{prefix}{path}.{name}" if path else prefix + name] = (sub, name, tuple(shape))
    return tensors, custom


def tied_names(modules: Mapping[str, Any] | Any) -> dict[str, str]:
    """transformers' tied weights of the modules, target -> source name (a tied LM head: the
    checkpoint holds only the embedding, and a packed copy of the head must follow it)."""
    named = modules.items() if isinstance(modules, Mapping) else [("", modules)]
    ties = {}
    for key, module in named:
        expand = getattr(module, "get_expanded_tied_weights_keys", None)
        prefix = f"{key}." if key else ""
        if callable(expand):
            ties.update({prefix + target: prefix + source for target, source in expand(all_submodels=True).items()})
    return ties


def load_weights(modules: Mapping[str, Any] | Any, tensors: Mapping[str, torch.Tensor]) -> int:
    """Copy `tensors` in (see the module docstring), tied targets from their sources; returns how
    many were given. ValueError naming the unknown names or mismatched shapes, with nothing copied."""
    import torch

    num_given = len(tensors)
    tensors = dict(tensors)
    for target, source in tied_names(modules).items():
        if source in tensors and target not in tensors:
            tensors[target] = tensors[source]
    targets, custom = _targets(modules)
    _refuse_sharded(targets, "weight updates")
    unknown = sorted(name for name in tensors if name not in targets and name not in custom)
    shapes = {**{name: tuple(t.shape) for name, t in targets.items()},
              **{name: shape for name, (_, _, shape) in custom.items()}}
    mismatched = [f"{name}: {tuple(t.shape)} for {shapes[name]}" for name, t in tensors.items()
                  if name in shapes and tuple(t.shape) != shapes[name]]
    if unknown or mismatched:
        problems = []
        if unknown:
            problems.append(f"{len(unknown)} name(s) the stage does not have ({', '.join(unknown[:MAX_NAMED])})")
        if mismatched:
            problems.append(f"{len(mismatched)} shape(s) that differ ({'; '.join(mismatched[:MAX_NAMED])})")
        raise ValueError(f"weights: {' and '.join(problems)}; nothing was changed")
    with torch.no_grad():
        for name, tensor in tensors.items():
            if name in custom:
                module, own, _ = custom[name]
                module.load_weight(own, tensor)
            else:
                targets[name].data.copy_(tensor)
    return num_given


def _refuse_sharded(targets: Mapping[str, Any], what: str) -> None:
    """ValueError when a module's parameters are sharded over ranks (DTensors: `fsdp_degree`),
    before anything is changed: each rank holds a shard, and no copy here reads or writes one."""
    from torch.distributed.tensor import DTensor

    sharded = [name for name, t in targets.items() if isinstance(t, DTensor)]
    if sharded:
        raise ValueError(f"weights: {what} of parameters sharded over ranks (fsdp_degree: {sharded[0]}, ...) are "
                         f"not supported in this version of omnistage; nothing was changed")


class Dropped:
    """The storage of `names` (state-dict names of `modules`, as in `load_weights`) freed."""

    def __init__(self, modules: Mapping[str, Any] | Any, names: Iterable[str]):
        import torch

        targets, custom = _targets(modules)
        _refuse_sharded(targets, "dropping weights (sleep level 2)")
        names = set(names)
        names |= {target for target, source in tied_names(modules).items() if source in names}
        self._shapes: dict[int, tuple[Any, torch.Size]] = {}
        num_custom = 0
        for name in names:
            tensor = targets.get(name)
            if tensor is not None and id(tensor) not in self._shapes and tensor.numel():
                self._shapes[id(tensor)] = (tensor, tensor.shape)
            elif name in custom:  # a transformed weight (packed): its module frees it, load_weight rebuilds it
                module, own, _ = custom[name]
                num_custom += module.drop_weight(own)
        self.num_bytes = num_custom + sum(t.numel() * t.element_size() for t, _ in self._shapes.values())
        """Bytes freed (on the device the weights were on)."""
        for tensor, _ in self._shapes.values():
            tensor.data = torch.empty(0, dtype=tensor.dtype, device=tensor.device)
        if any(t.device.type == "cuda" for t, _ in self._shapes.values()):
            torch.cuda.empty_cache()

    def restore(self, modules: Mapping[str, Any] | Any, tensors: Mapping[str, torch.Tensor]) -> None:
        """Allocate every dropped tensor again, then copy `tensors` (the checkpoint) in."""
        import torch

        for tensor, shape in self._shapes.values():
            tensor.data = torch.empty(shape, dtype=tensor.dtype, device=tensor.device)
        self._shapes.clear()
        load_weights(modules, tensors)
