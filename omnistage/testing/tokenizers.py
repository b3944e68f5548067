"""Tokenizers trained locally in about a second, saved in the real transformers formats.

No tokenizer can be downloaded here, so the zoo trains tiny ones with the `tokenizers`
library on a fixed corpus. Training is deterministic: the same arguments give the
same files.
"""

from __future__ import annotations

from collections.abc import Sequence

# A fixed corpus: prompts the tests and demos use, so they tokenize into real merges.
CORPUS = [
    "a photo of a cat sitting on a red chair",
    "a watercolor painting of a mountain lake at sunrise",
    "an astronaut riding a horse on the moon, highly detailed",
    "The quick brown fox jumps over the lazy dog.",
    "Hello world! How are you today? I am fine, thank you.",
    "The sun rises in the east and sets in the west.",
    "Please describe the image in one sentence.",
    "bad quality, blurry, low resolution, watermark",
    "user assistant system: you are a helpful assistant",
    "Once upon a time there was a little robot who loved to paint.",
    "0 1 2 3 4 5 6 7 8 9 10 100 1000",
] * 4

QWEN_SPECIAL_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
    "<|image_pad|>", "<|video_pad|>", "<think>", "</think>",
]

CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}{% if part['type'] == 'text' %}{{ part['text'] }}"
    "{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)


def build_bpe_tokenizer(
    special_tokens: Sequence[str] = QWEN_SPECIAL_TOKENS,
    *,
    vocab_size: int = 512,
    chat_template: str | None = CHATML_TEMPLATE,
    eos_token: str | None = None,
    pad_token: str | None = None,
    bos_token: str | None = None,
    model_max_length: int = 1024,
    padding_side: str = "right",
):
    """A byte-level BPE (GPT-2/Qwen style) as a `PreTrainedTokenizerFast`.

    Special tokens get the ids 0..len(special_tokens)-1 in the order given.
    `eos_token` and `pad_token` default to the first special token.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    first = special_tokens[0] if special_tokens else None
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=eos_token or first,
        pad_token=pad_token or first,
        bos_token=bos_token,
        additional_special_tokens=[t for t in special_tokens if t not in {eos_token or first, pad_token or first, bos_token}],
        padding_side=padding_side,
        model_max_length=model_max_length,
    )
    if chat_template is not None:
        hf.chat_template = chat_template
    return hf
