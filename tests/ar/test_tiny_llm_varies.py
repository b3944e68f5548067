"""The zoo's tiny qwen2-llm discriminates: greedy decoding of every prompt the AR tests use gives
varied tokens for 32 steps (testing/decoder_init.py), so a token-parity test fails when the
model sees the wrong context. A model that repeats one token cannot tell (issue: `[352] x 16`)."""

from __future__ import annotations

import itertools

import pytest

from ar_helpers import PROMPTS
from test_ar_paged import token_prompts

MAX_RUN = 3  # longest run of one token allowed in 32 greedy steps
NEW = 32


def longest_run(tokens: list[int]) -> int:
    return max(len(list(run)) for _, run in itertools.groupby(tokens))


def greedy(model, ids: list[int]) -> list[int]:
    """NEW greedy tokens, not stopping at an eos id (what varies is the point here)."""
    import torch

    x = torch.tensor([ids])
    with torch.inference_mode():
        out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=NEW, min_new_tokens=NEW,
                             do_sample=False)
    return out[0, len(ids):].tolist()


def test_greedy_output_varies_for_every_prompt_the_tests_use(hf_model, tokenizer):
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "Please describe the image in one sentence."}],
                                         add_generation_prompt=True, return_dict=True)["input_ids"]
    prompts = [tokenizer(p)["input_ids"] for p in PROMPTS] + [list(chat)]
    # test_ar_paged's and test_ar_packed's token prompts, drawn as they draw them: (n, length, seed)
    for n, length, seed in [(1, 40, 1), (1, 5, 3), (2, 30, 4), (4, 40, 5), (4, 20, 6), (1, 30, 7), (4, 40, 8),
                            (2, 40, 4), (1, 5, 5), (1, 12, 6), (1, 33, 7), (1, 5, 9), (1, 20, 10), (1, 40, 11),
                            (2, 30, 8)]:
        prompts += token_prompts(n, length, seed=seed)
    shared, prefix = token_prompts(1, 40, seed=1)[0], token_prompts(1, 20, seed=12)[0]
    prompts += token_prompts(4, 9, seed=2, prefix=shared)
    prompts += token_prompts(1, 4, seed=13, prefix=prefix) + token_prompts(1, 26, seed=14, prefix=prefix)
    for ids in prompts:
        tokens = greedy(hf_model, ids)
        assert longest_run(tokens) <= MAX_RUN, (ids, tokens)
        assert len(set(tokens)) >= NEW // 2, (ids, tokens)


def test_the_init_is_deterministic_per_seed():
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from omnistage.testing.decoder_init import init_varied_decoder

    config = Qwen2Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True)

    def weights(seed):
        model = Qwen2ForCausalLM(config)
        init_varied_decoder(model, seed)
        return model.state_dict()

    a, b, c = weights(0), weights(0), weights(1)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["model.embed_tokens.weight"], c["model.embed_tokens.weight"])
    assert a["model.norm.weight"].mean() < 0  # drawn around -2: the tied head's own-token logit goes down


def test_an_unknown_final_norm_is_refused():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from omnistage.testing.decoder_init import init_varied_decoder

    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1))
    with pytest.raises(KeyError, match="model.final_norm"):
        init_varied_decoder(model, 0, final_norm="model.final_norm")
