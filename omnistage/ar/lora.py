"""Per-request LoRA adapters for an AR stage, several in one batch (deploy `lora_adapters`, `max_loras`).

An adapter is a peft LoRA folder (`adapter_config.json` + `adapter_model.safetensors`, as
`PeftModel.save_pretrained` writes it). Loading one reads its A and B matrices for each
linear layer it adapts (B pre-multiplied by peft's scaling, lora_alpha / r) into that layer,
which is wrapped once in a `LoraLinear`; nothing is merged into the base weights.

NOTE on the algorithm (vLLM's batched LoRA, as dense matmuls that run on any device): before
each forward the runner sets the step's `LoraBatch`: the distinct (adapter, scale) groups its
rows use, and a `[tokens, groups]` matrix holding each token's group scale (0 elsewhere). A
`LoraLinear` runs its base layer once for the whole batch, then adds every row's low-rank delta
in two more matmuls whatever the number of adapters: the A matrices of the step's groups stacked
into one `[sum of ranks, in]`, the B matrices into one `[out, sum of ranks]` (built once per set
of groups and kept until an adapter loads or unloads), and between them each token's columns of
the other groups zeroed by that matrix:

    y += ((x @ A_cat.T) * scales[:, group of each column]) @ B_cat.T

So requests with different adapters, or none, share one forward, with four extra ops per layer
(a segment loop would cost four per adapter), and a step with no adapter pays one attribute
check per layer. The extra work grows with the sum of the step's ranks (at most max_num_seqs
groups), small beside the base matmul for LoRA ranks. The LM head sees one row per sequence
(`logits_to_keep`) rather than one per token: the batch holds the scales by row for it too.

Which adapters are loaded, and when, the engine decides (core/lora.py's `LoraSet`); a failed
load leaves nothing behind.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from omnistage.core.lora import short_error

if TYPE_CHECKING:
    from omnistage.ar.model import ModelInput

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
_PEFT_PREFIX = "base_model.model."
_REFUSED_OPTIONS = {"use_dora": "DoRA", "modules_to_save": "fully trained modules (modules_to_save)",
                    "alpha_pattern": "per-layer alphas (alpha_pattern)", "lora_bias": "LoRA biases (lora_bias)",
                    "fan_in_fan_out": "Conv1D layers (fan_in_fan_out)"}
"""peft options this engine does not apply: an adapter that sets one is refused, naming it."""


def adapter_folder_problem(path: str) -> str | None:
    """Why `path` is no peft adapter folder on the server, or None."""
    folder = Path(path)
    if not folder.is_dir():
        return f"no peft adapter folder {path!r} on the server"
    if not (folder / CONFIG_FILE).is_file():
        return f"{path!r} has no {CONFIG_FILE} (a peft adapter folder, as PeftModel.save_pretrained writes it)"
    return None


class LoraLinear(nn.Module):
    """A linear layer plus, for each loaded adapter that adapts it, A and B (scaled): adds each
    row's adapter delta to the base layer's output, as the step's `LoraBatch` says."""

    def __init__(self, base: nn.Module, table: AdapterTable) -> None:
        super().__init__()
        self.base = base
        self.in_features, self.out_features = base.in_features, base.out_features
        self.table = table
        self.adapters: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        """Adapter id -> (A [r, in], B * lora_alpha / r [out, r])."""
        self._stack_key: tuple[int, ...] | None = None
        self._stack: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        """For the adapter ids of the last step's groups (steps mostly repeat them): A_cat, B_cat and
        the group of each rank column; None: none of them adapts this layer."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        batch = self.table.batch
        if batch is None:  # no row of this step has an adapter
            return y
        stack = self._stacked(batch.adapters)
        if stack is None:  # no adapter of this step adapts this layer
            return y
        a, b, columns = stack
        xf, yf = x.reshape(-1, self.in_features), y.view(-1, self.out_features)
        scales = batch.scales_for(xf.shape[0])  # [tokens or rows, groups]
        yf.addmm_((xf @ a.t()) * scales[:, columns], b.t())
        return y

    def _stacked(self, adapters: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        if adapters != self._stack_key:
            held = [(g, self.adapters[uid]) for g, uid in enumerate(adapters) if uid in self.adapters]
            self._stack_key, self._stack = adapters, None if not held else (
                torch.cat([a for _, (a, _) in held]), torch.cat([b for _, (_, b) in held], dim=1),
                torch.tensor([g for g, (a, _) in held for _ in range(a.shape[0])], device=held[0][1][0].device))
        return self._stack

    def forget_stacks(self) -> None:
        """An adapter loaded or unloaded: the stack is rebuilt on its next use."""
        self._stack_key = self._stack = None


@dataclass
class LoraBatch:
    """One forward's (adapter, scale) groups: their adapter ids, and each token's (and each row's, for
    the LM head's input) scale in its group's column, 0 in the others."""

    adapters: tuple[int, ...]
    by_token: torch.Tensor
    """[tokens, groups]"""
    by_row: torch.Tensor
    """[rows, groups]"""

    def scales_for(self, num: int) -> torch.Tensor:
        if num == self.by_token.shape[0]:
            return self.by_token
        if num == self.by_row.shape[0]:
            return self.by_row
        raise RuntimeError(f"a LoRA layer got {num} rows; this forward has {self.by_token.shape[0]} tokens in "
                           f"{self.by_row.shape[0]} sequences")


class AdapterTable:
    """The adapters one AR model holds (by name, each with an id unique to its load) and the step's
    `LoraBatch` its `LoraLinear` layers read."""

    def __init__(self, model: nn.Module, device: torch.device, dtype: torch.dtype) -> None:
        self.model = model
        self.device, self.dtype = device, dtype
        self.ids: dict[str, int] = {}
        self._next_id = 1
        self.batch: LoraBatch | None = None

    # --- loading -----------------------------------------------------------------------------

    def load(self, name: str, path: str) -> str | None:
        """Load adapter `name` from peft folder `path`; the reason it cannot (a missing folder, an
        option this engine does not apply, layers or shapes this model does not have), with
        nothing of it loaded, or None."""
        try:
            weights = self._read(path)
        except ValueError as exc:  # what _read found wrong, said in full
            return f"cannot load adapter {name!r} from {path}: {exc}"
        except Exception as exc:  # noqa: BLE001 - any failure of the files is the caller's: report it
            return f"cannot load adapter {name!r} from {path}: {short_error(exc)}"
        uid, self._next_id = self._next_id, self._next_id + 1
        for module_name, (a, b) in weights.items():
            layer = self._wrapped(module_name)
            layer.adapters[uid] = (a, b)
            layer.forget_stacks()
        self.ids[name] = uid
        return None

    def unload(self, name: str) -> None:
        uid = self.ids.pop(name, None)
        for module in self.model.modules():
            if isinstance(module, LoraLinear) and module.adapters.pop(uid, None) is not None:
                module.forget_stacks()

    def _read(self, path: str) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """{layer name: (A, scaled B)} of the peft adapter at `path`, checked against the model."""
        from safetensors.torch import load_file

        problem = adapter_folder_problem(path)
        if problem is not None:
            raise ValueError(problem)
        config = json.loads((Path(path) / CONFIG_FILE).read_text())
        if config.get("peft_type", "LORA") != "LORA":
            raise ValueError(f"a {config.get('peft_type')} adapter, not LoRA")
        for option, what in _REFUSED_OPTIONS.items():
            if config.get(option):
                raise ValueError(f"its {CONFIG_FILE} uses {what}, which this engine does not apply")
        file = Path(path) / WEIGHTS_FILE
        if not file.is_file():
            raise ValueError(f"no {WEIGHTS_FILE} in {path!r} (save the adapter with safe_serialization)")
        tensors = load_file(str(file))
        pairs: dict[str, dict[str, torch.Tensor]] = {}
        for key, tensor in tensors.items():
            module_name, _, kind = key.removeprefix(_PEFT_PREFIX).rpartition(".lora_")
            if kind not in ("A.weight", "B.weight"):
                raise ValueError(f"tensor {key!r} is not a LoRA A or B matrix of a linear layer")
            pairs.setdefault(module_name, {})[kind[0]] = tensor
        if not pairs:
            raise ValueError(f"{WEIGHTS_FILE} holds no LoRA matrices")
        modules = dict(self.model.named_modules())
        weights = {}
        for module_name, pair in sorted(pairs.items()):
            a, b = pair.get("A"), pair.get("B")
            if a is None or b is None:
                raise ValueError(f"layer {module_name}: lora_{'A' if a is None else 'B'} is missing")
            layer = modules.get(module_name)
            if layer is None or not hasattr(layer, "in_features"):
                raise ValueError(f"this model has no linear layer {module_name!r}")
            rank = a.shape[0]
            if a.shape != (rank, layer.in_features) or b.shape != (layer.out_features, rank):
                raise ValueError(f"layer {module_name}: lora_A {list(a.shape)} and lora_B {list(b.shape)} do not fit "
                                 f"its {layer.in_features} inputs and {layer.out_features} outputs")
            alpha = config.get("lora_alpha", 8)  # peft LoraConfig's default
            scaling = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
            weights[module_name] = (a.to(self.device, self.dtype), (b * scaling).to(self.device, self.dtype))
        return weights

    def _wrapped(self, module_name: str) -> LoraLinear:
        """The `LoraLinear` around layer `module_name`, wrapping it on the first adapter that adapts it."""
        module = self.model.get_submodule(module_name)
        if isinstance(module, LoraLinear):
            return module
        parent_name, _, child = module_name.rpartition(".")
        wrapped = LoraLinear(module, self)
        self.model.get_submodule(parent_name).register_module(child, wrapped)
        return wrapped

    # --- one forward -------------------------------------------------------------------------

    def begin(self, inp: ModelInput) -> None:
        """Set the `LoraBatch` of forward `inp` (None when no row has an adapter)."""
        keys = [seq.lora for seq in inp.seqs]
        if not any(keys):
            self.batch = None
            return
        if inp.packed:  # rows end to end
            lens = list(inp.query_lens)
        else:  # row i is tokens i*T .. i*T + T-1, its padding included (harmless: never read)
            lens = [inp.input_ids.shape[1]] * len(keys)
        groups = list(dict.fromkeys(k for k in keys if k is not None))  # distinct (adapter, scale), in order
        by_row = torch.zeros(len(keys), len(groups))
        for i, key in enumerate(keys):
            if key is not None:
                g = groups.index(key)
                by_row[i, g] = key[1]
        by_token = by_row.repeat_interleave(torch.tensor(lens), dim=0)
        self.batch = LoraBatch(tuple(uid for uid, _ in groups), by_token.to(self.device, self.dtype),
                               by_row.to(self.device, self.dtype))

    def end(self) -> None:
        self.batch = None
