"""The support matrix: every native diffusion pipeline x what it takes, read from the
families' declarations (`supported_accelerations`, `needs_image` / `takes_image`,
`output_modality`) and their registered `PipelineSpec` (the default scheduling mode).

`omnistage models` prints it and scripts/gen_docs.py writes it into docs/reference/support.md,
so the table cannot drift from what the stages accept.
"""

from __future__ import annotations

from dataclasses import dataclass

from omnistage.diffusion.accel.declaration import Accelerations

COLUMNS = ("pipeline", "in", "out", "default mode", "CFG-parallel", "Ulysses", "ring", "tensor parallel", "FSDP",
           "VAE patch parallel", "step caches", "VAE tiling, slicing", "offload", "quantization", "LoRA", "compile")
"""The matrix's columns; the last twelve are the accelerations."""


@dataclass(frozen=True)
class Row:
    key: str
    """The registry key: the checkpoint's diffusers `_class_name`."""
    family: str
    """The family's folder under omnistage/models/."""
    inputs: str
    output: str
    default_mode: str
    accelerations: Accelerations

    def cells(self) -> list[str]:
        a = self.accelerations
        flags = [a.cfg_parallel, a.sequence_parallel is not None, a.ring, bool(a.tensor_parallel), a.fsdp,
                 a.vae_patch_parallel]
        memory = [a.vae_tiling, a.offload, a.quantization, a.lora, a.compile]
        return [self.key, self.inputs, self.output, self.default_mode, *map(_yes, flags),
                ", ".join(a.step_caches) or "no", *map(_yes, memory)]


def _yes(taken: bool) -> str:
    return "yes" if taken else "no"


def rows() -> list[Row]:
    """One row per native diffusion pipeline, by registry key."""
    from omnistage.config.registry import REGISTRY
    from omnistage.diffusion.registry import native_keys, pipeline_class

    out = []
    for key in native_keys():
        cls = pipeline_class(key)
        inputs = "text, image" if cls.needs_image else "text (+ images)" if cls.takes_image else "text"
        if cls.takes_video:  # an optional control or conditioning clip (Wan-VACE, Cosmos3)
            inputs = inputs.replace(")", ", video)") if "(" in inputs else inputs + " (+ video)"
        out.append(Row(key, cls.__module__.split(".")[2], inputs, cls.output_modality,
                       _default_mode(REGISTRY.spec_of(key), key), cls.supported_accelerations))
    return out


def _default_mode(spec, key: str) -> str:
    """The stage's `step_execution` default, from the family's PipelineSpec (a spec resolved
    from the checkpoint's files has none until then)."""
    if spec is None:
        return "per checkpoint"
    stage = next((s for s in spec.stages if s.kind == "diffusion" and s.model in (None, key)), None)
    if stage is None or "step_execution" not in stage.defaults:
        return "request"  # StageDeployConfig's default
    return "step" if stage.defaults["step_execution"] else "request"


def refusals(rows: list[Row]) -> list[tuple[str, str, str]]:
    """(pipeline, deploy field, why) for every reason a family gives for what it does not take."""
    return [(row.key, name, why) for row in rows for name, why in row.accelerations.refused.items()]


def markdown(rows: list[Row]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join([f"`{row.key}`", *row.cells()[1:]]) + " |" for row in rows]
    reasons = refusals(rows)
    if reasons:
        lines += ["", "Why a family does not take a field, where it says:", ""]
        lines += [f"- `{key}`, `{name}`: {why}." for key, name, why in reasons]
    return "\n".join(lines)


def text(rows: list[Row]) -> str:
    """The matrix as aligned plain-text columns (the CLI)."""
    table = [list(COLUMNS)] + [row.cells() for row in rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(COLUMNS))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in table]
    reasons = refusals(rows)
    if reasons:
        lines += ["", "refused, with the family's reason:"]
        lines += [f"  {key} {name}: {why}" for key, name, why in reasons]
    return "\n".join(lines)
