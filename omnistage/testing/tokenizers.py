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

# Qwen2.5-Instruct's template, trimmed to what it does with tools: the function
# definitions go in the system turn with the <tool_call> format, an assistant's calls are
# written back as <tool_call> blocks and tool answers as <tool_response> in a user turn.
QWEN_TOOLS_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n"
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}{% else %}You are a helpful assistant."
    "{% endif %}\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
    "{% for tool in tools %}\n{{ tool | tojson }}{% endfor %}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\n</tool_call><|im_end|>\n"
    "{% elif messages[0]['role'] == 'system' %}<|im_start|>system\n{{ messages[0]['content'] }}<|im_end|>\n"
    "{% endif %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}"
    "{% elif message['role'] == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}<|im_start|>user{% endif %}"
    "\n<tool_response>\n{{ message['content'] }}\n</tool_response>"
    "{% if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}<|im_end|>\n{% endif %}"
    "{% else %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% elif message['content'] %}{% for part in message['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}"
    "{% for call in message.get('tool_calls') or [] %}\n<tool_call>\n{\"name\": \""
    "{{ call['function']['name'] }}\", \"arguments\": {{ call['function']['arguments'] | tojson }}}"
    "\n</tool_call>{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
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


def _trained_model(tokenizer) -> dict:
    """The `model` section (vocab, merges) of a trained `tokenizers.Tokenizer`."""
    import json

    return json.loads(tokenizer.to_str())["model"]


def build_qwen2_tokenizer(
    *, vocab_size: int = 512, chat_template: str | None = CHATML_TEMPLATE, model_max_length: int = 1024
):
    """`build_bpe_tokenizer`'s vocabulary and merges in transformers' `Qwen2Tokenizer`.

    Real Qwen checkpoints (and the diffusers pipelines built on them) name the
    `Qwen2Tokenizer` class, which brings Qwen's own pre-tokenizer regex and NFC
    normalizer. Special tokens keep the ids 0..8 (`<|endoftext|>` = 0).
    """
    from transformers import Qwen2Tokenizer

    bpe = build_bpe_tokenizer(vocab_size=vocab_size, chat_template=None)
    model = _trained_model(bpe.backend_tokenizer)
    tok = Qwen2Tokenizer(
        vocab=model["vocab"],
        merges=[tuple(m) for m in model["merges"]],
        extra_special_tokens=QWEN_SPECIAL_TOKENS[1:],
        model_max_length=model_max_length,
        padding_side="right",
    )
    if chat_template is not None:
        tok.chat_template = chat_template
    return tok


def _learn_bpe_merges(word_counts: dict[tuple[str, ...], int], num_merges: int) -> list[tuple[str, str]]:
    """Classic BPE (Sennrich et al.) over symbol sequences.

    The `tokenizers` trainer breaks ties between equally frequent pairs by symbol ids
    that it assigns in hash-map order once `end_of_word_suffix` is set, so its merges
    change from run to run. Here ties go to the smallest pair, which is deterministic.
    """
    words = dict(word_counts)
    merges: list[tuple[str, str]] = []
    for _ in range(num_merges):
        pairs: dict[tuple[str, str], int] = {}
        for symbols, count in words.items():
            for pair in zip(symbols, symbols[1:]):
                pairs[pair] = pairs.get(pair, 0) + count
        if not pairs:
            break
        best = min(pairs, key=lambda pair: (-pairs[pair], pair))
        merges.append(best)
        merged = {}
        for symbols, count in words.items():
            out, i = [], 0
            while i < len(symbols):
                if symbols[i : i + 2] == best:
                    out.append(best[0] + best[1])
                    i += 2
                else:
                    out.append(symbols[i])
                    i += 1
            merged[tuple(out)] = merged.get(tuple(out), 0) + count
        words = merged
    return merges


def build_clip_tokenizer(*, num_merges: int = 256, model_max_length: int = 77):
    """A CLIP tokenizer (`CLIPTokenizer`: lowercase, `</w>` word ends, byte-level BPE).

    The vocabulary is laid out like the real one: the 256 byte symbols, the same with
    `</w>`, one token per learned merge, then `<|startoftext|>` and `<|endoftext|>` last
    (eos doubles as pad and unk, as in the CLIP checkpoints of Flux and SD3).
    """
    from tokenizers import pre_tokenizers
    from transformers import CLIPTokenizer

    # An empty CLIPTokenizer carries CLIP's normalizer and pre-tokenizer: split the
    # corpus into words with those.
    backend = CLIPTokenizer().backend_tokenizer
    word_counts: dict[tuple[str, ...], int] = {}
    for line in CORPUS:
        for word, _ in backend.pre_tokenizer.pre_tokenize_str(backend.normalizer.normalize_str(line)):
            symbols = (*word[:-1], word[-1] + "</w>")
            word_counts[symbols] = word_counts.get(symbols, 0) + 1
    merges = _learn_bpe_merges(word_counts, num_merges)
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tokens = alphabet + [c + "</w>" for c in alphabet] + [a + b for a, b in merges]
    tokens = list(dict.fromkeys(tokens)) + ["<|startoftext|>", "<|endoftext|>"]
    return CLIPTokenizer(
        vocab={t: i for i, t in enumerate(tokens)}, merges=merges, model_max_length=model_max_length
    )


def build_t5_tokenizer(*, extra_ids: int = 0, model_max_length: int = 512):
    """A T5 tokenizer (`T5Tokenizer`: SentencePiece-style Unigram with `▁` word starts).

    `<pad>` = 0, `</s>` = 1, `<unk>` = 2 as in T5 and UMT5; every sequence ends in `</s>`.
    The pieces are the corpus words plus single printable characters, scored by their
    log frequency: a unigram model written down rather than trained, because the
    `tokenizers` Unigram trainer's scores differ in the last bits from run to run.
    """
    import math
    import string

    from transformers import T5Tokenizer

    counts: dict[str, int] = {}
    for line in CORPUS:
        for word in line.split():
            counts["▁" + word] = counts.get("▁" + word, 0) + 1
    for char in "▁" + string.ascii_letters + string.digits + string.punctuation:
        counts[char] = counts.get(char, 0) + 1
    total = sum(counts.values())
    pieces = sorted(counts, key=lambda piece: (-counts[piece], piece))
    vocab = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)]
    vocab += [(piece, round(math.log(counts[piece] / total), 4)) for piece in pieces]
    return T5Tokenizer(vocab=vocab, extra_ids=extra_ids, model_max_length=model_max_length)
