"""The default ARModel: any transformers `AutoModelForCausalLM`, run through its own forward.

The engine's attention masks are handed to the model as a ready mask mapping (the same
door `generate` uses), so transformers builds no masks of its own, and the paged KV cache
goes in through the public `cache=` argument. The model loads with packed_attention's
attention function (registered through transformers' `AttentionInterface`), which is
transformers' SDPA for padded batches and per-row SDPA for packed ones. Nothing in
transformers is patched.
"""

from __future__ import annotations

from pathlib import Path

import torch

from omnistage.ar.kv_cache import kv_dims
from omnistage.ar.model import ARModel, ModelInput, ModelOutput
from omnistage.ar.packed_attention import ATTN_IMPLEMENTATION


class HFCausalLM(ARModel):
    supports_chunked_prefill = True  # token ids in, plain positions: any span can be fed
    supports_packed_batch = True  # and the layers see only ids, positions and the mask (a subclass
    # with its own forward says False unless that forward takes the packed layout too)
    supports_cuda_graphs = True  # its forward reads only ModelInput's tensors
    supports_prepacked_linears = True  # transformers' layers only call their linears

    def __init__(self, model, tokenizer, eos_token_ids: tuple[int, ...], device: torch.device) -> None:
        text_config = model.config.get_text_config()
        self.model = model
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids
        self.device = device
        self.num_layers = text_config.num_hidden_layers
        self.kv_dims = kv_dims(text_config)
        self.max_position_embeddings = text_config.max_position_embeddings
        layer_types = getattr(text_config, "layer_types", None) or ["full_attention"] * self.num_layers
        self.mask_types = sorted(set(layer_types))
        self.sliding_window = getattr(text_config, "sliding_window", None)
        # the in-place kernel knows plain causal attention only (no sliding window), through the packed
        # layout (a subclass with its own forward says supports_packed_batch = False)
        self.supports_paged_attention = self.supports_packed_batch and self.mask_types == ["full_attention"]
        unsupported = set(self.mask_types) - {"full_attention", "sliding_attention"}
        if unsupported:
            raise ValueError(f"HFCausalLM supports full and sliding attention layers, not {sorted(unsupported)}")

    @classmethod
    def load(cls, model_path: str, stage, device: torch.device, dtype: torch.dtype) -> HFCausalLM:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype, attn_implementation=ATTN_IMPLEMENTATION)
        model = model.to(device).eval()
        return cls(model, load_tokenizer(model_path), eos_token_ids(model_path, model.config), device)

    def forward(self, batch: ModelInput, cache) -> ModelOutput:
        masks = {}
        for kind in self.mask_types:
            masks[kind] = batch.attention_mask if kind == "full_attention" else self._sliding(batch)
        if batch.packed:
            keep = batch.last_indices  # [B] positions of the one packed row
        else:
            keep = batch.last_indices[:, None] if batch.last_indices is not None else 1
        want_states = batch.output_hidden_states or batch.output_input_embeds
        out = self.model(input_ids=batch.input_ids, position_ids=batch.positions, attention_mask=masks,
                         cache=cache, use_cache=True, logits_to_keep=keep, output_hidden_states=want_states)
        states = out.hidden_states
        return ModelOutput(
            logits=out.logits[0] if batch.packed else out.logits[:, -1],
            hidden_states=states[-1] if batch.output_hidden_states else None,
            input_embeds=states[0] if batch.output_input_embeds else None,
        )

    def _sliding(self, batch: ModelInput) -> torch.Tensor:
        if batch.packed:
            return batch.attention_mask.windowed(self.sliding_window)
        keys = torch.arange(batch.kv_len, device=batch.positions.device)
        in_window = keys[None, None, :] > batch.positions[:, :, None] - self.sliding_window
        return batch.attention_mask & in_window[:, None]

    def close(self) -> None:
        self.model = None


def load_tokenizer(model_path: str):
    """The checkpoint's tokenizer, or None when the folder has none (a codes-only stage)."""
    from transformers import AutoTokenizer

    path = Path(model_path)
    if path.is_dir() and not any((path / f).exists() for f in ("tokenizer.json", "tokenizer_config.json")):
        return None
    return AutoTokenizer.from_pretrained(model_path)


def eos_token_ids(model_path: str, config) -> tuple[int, ...]:
    """EOS ids as `generate` would use them: generation_config.json first, then the model config."""
    from transformers import GenerationConfig

    try:
        eos = GenerationConfig.from_pretrained(model_path).eos_token_id
    except OSError:
        eos = None
    if eos is None:
        eos = config.get_text_config().eos_token_id
    if eos is None:
        return ()
    return tuple(eos) if isinstance(eos, (list, tuple)) else (eos,)
