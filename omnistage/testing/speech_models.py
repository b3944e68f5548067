"""AR / omni / speech zoo builders (transformers folders).

Each builder writes a random-weight checkpoint that the reference class loads with
`from_pretrained` and runs with `generate`, plus the tokenizer, chat template and
generation config it needs at run time. Weights are fp32 (the parity tests run fp32).
"""

from __future__ import annotations

from pathlib import Path

from omnistage.testing.tokenizers import CHATML_TEMPLATE, QWEN_SPECIAL_TOKENS, build_bpe_tokenizer
from omnistage.testing.zoo import ZooModel, register_zoo_model


# --------------------------------------------------------------------------- helpers


def _save(out_dir: Path, model, tokenizer, generation_config=None) -> None:
    """Write model weights (fp32 safetensors), config, generation config and tokenizer."""
    model.save_pretrained(out_dir, safe_serialization=True)
    if generation_config is not None:
        generation_config.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


# --------------------------------------------------------------------------- qwen2-llm

# head_dim 64: vLLM's CPU attention accepts only head sizes in {32, 64, 80, ...}.
_QWEN2_SIZES = {
    "tiny": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=1, head_dim=64),
    "small": dict(hidden_size=512, intermediate_size=768, num_hidden_layers=4, num_attention_heads=8,
                  num_key_value_heads=2, head_dim=64),
}
QWEN2_VOCAB = 1024


def build_qwen2_llm(out_dir: Path, size: str, seed: int) -> None:
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    tok = build_bpe_tokenizer(QWEN_SPECIAL_TOKENS, vocab_size=QWEN2_VOCAB, chat_template=CHATML_TEMPLATE,
                              eos_token="<|im_end|>", pad_token="<|endoftext|>", model_max_length=2048)
    assert len(tok) <= QWEN2_VOCAB, len(tok)
    endoftext, im_end = tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_end|>"])
    # Like the real Qwen2.5 instruct checkpoints: bos = pad = <|endoftext|>, the model stops on
    # <|im_end|> (chat) or <|endoftext|> (plain completion).
    config = Qwen2Config(vocab_size=QWEN2_VOCAB, max_position_embeddings=2048, tie_word_embeddings=True,
                         bos_token_id=endoftext, eos_token_id=im_end, pad_token_id=endoftext,
                         **_QWEN2_SIZES[size])
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).float().eval()
    gen = GenerationConfig(bos_token_id=endoftext, eos_token_id=[im_end, endoftext], pad_token_id=endoftext)
    _save(out_dir, model, tok, gen)


register_zoo_model(ZooModel(
    name="qwen2-llm",
    kind="ar",
    reference_class="transformers.Qwen2ForCausalLM",
    builder=build_qwen2_llm,
    sizes=("tiny", "small"),
    description="Qwen2 causal LM (head_dim 64, vocab 1024), ChatML template, fp32.",
))
