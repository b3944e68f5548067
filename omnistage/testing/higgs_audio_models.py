"""Zoo builder for Higgs-Audio v2: the generation model folder plus its audio tokenizer.

The folder is what transformers' conversion script writes (`HiggsAudioV2ForConditionalGeneration`
weights, generation config, tokenizer, and the processor's `processor_config.json` and chat
template), with the audio tokenizer (`HiggsAudioV2TokenizerModel`'s config.json +
model.safetensors) in `audio_tokenizer/`, which `processor_config.json` names. Sizes are
tiny: 4 codebooks of 32 codes (+ the stream BOS/EOS ids 32, 33), 25 frames/s at 24 kHz
(960 samples per frame, as the real tokenizer).

transformers cannot build `HiggsAudioV2TokenizerModel` without torchaudio, so its tensors are
written from their parts: the decoding half through omnistage's `HiggsCodecDecoder` (the
tokenizer's own names), the DAC encoder and HuBERT through transformers, and the small
semantic convolution stacks by their shapes. transformers' class loads the file with no
missing or unexpected key. `processor_config.json` names the tokenizer by the relative path
"audio_tokenizer" (the zoo folder is built elsewhere and moved into place): omnistage resolves
it from the model folder; transformers' `HiggsAudioV2Processor.from_pretrained` resolves it
from the working directory (or takes `audio_tokenizer=`).
"""

from __future__ import annotations

import json
from pathlib import Path

from omnistage.testing.decoder_init import init_varied_decoder
from omnistage.testing.tokenizers import build_bpe_tokenizer
from omnistage.testing.zoo import ZooModel, register_zoo_model

# The Llama-3 specials Higgs-Audio uses (128000.. there, 0.. here); the delay token is
# <|reserved_special_token_6|>, as the processor's default.
HIGGS_SPECIAL_TOKENS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                        "<|eot_id|>", "<|scene_desc_start|>", "<|scene_desc_end|>", "<|audio_out_bos|>",
                        "<|AUDIO_OUT|>", "<|audio_eos|>", "<|reserved_special_token_6|>"]
HIGGS_TEXT_VOCAB = 512
HIGGS_NUM_CODEBOOKS, HIGGS_CODEC_SIZE = 4, 32  # real: 8 x 1024
HIGGS_SAMPLE_RATE = 24000

# transformers' conversion script's CHAT_TEMPLATE (convert_higgs_audio_v2_to_hf.py), unchanged.
HIGGS_CHAT_TEMPLATE = (
    "{{- bos_token }}\n"
    "{%- if messages[0]['role'] == 'system' %}\n"
    "    {%- if messages[0]['content'] is string %}\n"
    "        {%- set system_message = messages[0]['content']|trim %}\n"
    "    {%- elif messages[0]['content'] is iterable and messages[0]['content'][0]['type'] == 'text' %}\n"
    "        {%- set system_message = messages[0]['content'][0]['text']|trim %}\n"
    "    {%- else %}\n"
    "        {{- raise_exception(\"System message content must be a string or contain text type!\") }}\n"
    "    {%- endif %}\n"
    "    {%- set messages = messages[1:] %}\n"
    "{%- else %}\n"
    "    {{- raise_exception(\"A system message is required but not provided!\") }}\n"
    "{%- endif %}\n\n"
    "{{- \"<|start_header_id|>system<|end_header_id|>\\n\\n\" }}\n"
    "{{- system_message }}\n\n"
    "{%- if messages and messages[0]['role'] == 'scene' %}\n"
    "    {{- \"\\n\\n<|scene_desc_start|>\\n\" }}\n"
    "    {%- if messages[0]['content'] is string %}\n"
    "        {{- messages[0]['content'] | trim }}\n"
    "    {%- elif messages[0]['content'] is iterable %}\n"
    "        {%- for content_item in messages[0]['content'] %}\n"
    "            {%- if content_item['type'] == 'text' %}\n"
    "                {%- set text_content = content_item['text'] | trim %}\n"
    "                {{- text_content }}\n"
    "                {%- if loop.first and not loop.last %}\n"
    "                    {{- \"\\n\\n\" }}\n"
    "                {%- endif %}\n"
    "                {%- if not loop.first and not loop.last and messages[0]['content'][loop.index]['type'] != 'audio' %}\n"
    "                    {{- \"\\n\" }}\n"
    "                {%- endif %}\n"
    "            {%- elif content_item['type'] == 'audio' %}\n"
    "                {{- ' <|audio_out_bos|><|AUDIO_OUT|><|audio_eos|>' }}\n"
    "                {%- if not loop.last %}\n"
    "                    {{- \"\\n\" }}\n"
    "                {%- endif %}\n"
    "            {%- endif %}\n"
    "        {%- endfor %}\n"
    "    {%- endif %}\n"
    "    {{- \"\\n<|scene_desc_end|>\" }}\n"
    "    {%- set messages = messages[1:] %}\n"
    "{%- endif %}\n\n"
    "{{- \"<|eot_id|>\" }}\n\n"
    "{%- for message in messages %}\n"
    "    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}\n"
    "    {%- if message['role'] == 'assistant' %}\n"
    "        {%- if message['content'] is not iterable or message['content'][0]['type'] != 'audio' %}\n"
    "            {{- raise_exception(\"Assistant messages must contain audio content only!\") }}\n"
    "        {%- endif %}\n"
    "        {{- '<|audio_out_bos|><|AUDIO_OUT|><|audio_eos|>' }}\n"
    "    {%- else %}\n"
    "        {%- if message['content'] is string %}\n"
    "            {{- message['content'] | trim }}\n"
    "        {%- elif message['content'] is iterable %}\n"
    "            {%- for content_item in message['content'] %}\n"
    "                {%- if content_item['type'] == 'text' %}\n"
    "                    {{- content_item['text'] | trim }}\n"
    "                {%- endif %}\n"
    "            {%- endfor %}\n"
    "        {%- endif %}\n"
    "    {%- endif %}\n"
    "    {{- '<|eot_id|>' }}\n"
    "{%- endfor %}\n\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n<|audio_out_bos|>' }}\n"
    "{%- endif %}"
)


def _tokenizer_config():
    from transformers import HiggsAudioV2TokenizerConfig

    return HiggsAudioV2TokenizerConfig(
        acoustic_model_config=dict(encoder_hidden_size=4, downsampling_ratios=[8, 5, 4, 2, 3], decoder_hidden_size=32,
                                   upsampling_ratios=[8, 5, 4, 2, 3], hidden_size=16),
        semantic_model_config=dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                                   conv_dim=[8] * 7, num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2),
        target_bandwidths=[0.5],  # 4 quantizers of 5 bits at 25 frames/s
        codebook_size=HIGGS_CODEC_SIZE, codebook_dim=8, sample_rate=HIGGS_SAMPLE_RATE)


def _semantic_convs(config, g) -> dict:
    """`encoder_semantic` and `decoder_semantic` tensors by name and shape (stride-1 blocks)."""
    import torch

    if any(s != 1 for s in config.strides) or any(r != 1 for r in config.channel_ratios):
        raise ValueError("the zoo writes stride-1, ratio-1 semantic stacks only")
    s, k, uk = config.semantic_hidden_size, config.kernel_size, config.unit_kernel_size
    shapes = {"encoder_semantic.conv.weight": (s, s, k), "decoder_semantic.conv1.weight": (s, s, k),
              "decoder_semantic.conv2.weight": (s, s, k)}
    for side in ("encoder_semantic", "decoder_semantic"):
        for b in range(len(config.strides)):
            shapes[f"{side}.conv_blocks.{b}.conv.weight"] = (s, s, 3)
            shapes[f"{side}.conv_blocks.{b}.conv.bias"] = (s,)
            for u in range(len(config.block_dilations)):
                shapes[f"{side}.conv_blocks.{b}.res_units.{u}.conv1.weight"] = (s, s, uk)
                shapes[f"{side}.conv_blocks.{b}.res_units.{u}.conv2.weight"] = (s, s, 1)
    return {name: torch.randn(shape, generator=g) * 0.1 for name, shape in shapes.items()}


def build_audio_tokenizer(out_dir: Path, seed: int) -> None:
    """The tokenizer folder (config.json + model.safetensors) that `HiggsAudioV2TokenizerModel` loads."""
    import torch
    from safetensors.torch import save_file
    from transformers import DacModel, HubertModel

    from omnistage.models.higgs_audio.codec_model import HiggsCodecDecoder

    config = _tokenizer_config()
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    decoder = HiggsCodecDecoder(config)
    state = {k: v.clone() for k, v in decoder.state_dict().items()}
    for i in range(config.num_quantizers):  # codebooks are running averages (zero at init): draw them
        state[f"quantizer.quantizers.{i}.codebook.embed"] = torch.randn(config.codebook_size, config.codebook_dim,
                                                                        generator=g)
        state[f"quantizer.quantizers.{i}.codebook.embed_avg"] = state[f"quantizer.quantizers.{i}.codebook.embed"].clone()
    state |= {f"acoustic_encoder.{k}": v for k, v in DacModel(config.acoustic_model_config).encoder.state_dict().items()}
    state |= {f"semantic_model.{k}": v for k, v in HubertModel(config.semantic_model_config).state_dict().items()
              if k != "masked_spec_embed"}
    for name, (n_in, n_out) in {"fc": (config.hidden_size, config.hidden_size),
                                "fc1": (config.hidden_size, config.semantic_hidden_size)}.items():
        state[f"{name}.weight"] = torch.randn(n_out, n_in, generator=g) / n_in ** 0.5
        state[f"{name}.bias"] = torch.zeros(n_out)
    state |= _semantic_convs(config, g)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous().float() for k, v in state.items()}, out_dir / "model.safetensors",
              metadata={"format": "pt"})
    config.save_pretrained(out_dir)


def build_higgs_audio(out_dir: Path, size: str, seed: int) -> None:
    import torch
    from transformers import DacFeatureExtractor, GenerationConfig, HiggsAudioV2Config, HiggsAudioV2ForConditionalGeneration

    tok = build_bpe_tokenizer(HIGGS_SPECIAL_TOKENS, vocab_size=448, chat_template=None,
                              bos_token="<|begin_of_text|>", eos_token="<|end_of_text|>", pad_token="<|end_of_text|>",
                              model_max_length=2048, padding_side="left")
    ids = dict(zip(HIGGS_SPECIAL_TOKENS, tok.convert_tokens_to_ids(HIGGS_SPECIAL_TOKENS)))
    codec_size = HIGGS_CODEC_SIZE
    config = HiggsAudioV2Config(
        vocab_size=HIGGS_TEXT_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=2048,
        num_codebooks=HIGGS_NUM_CODEBOOKS, codebook_size=codec_size + 2,  # + the stream BOS and EOS ids
        audio_stream_bos_id=codec_size, audio_stream_eos_id=codec_size + 1,
        bos_token_id=ids["<|begin_of_text|>"], pad_token_id=ids["<|end_of_text|>"], eos_token_id=ids["<|eot_id|>"],
        audio_token_id=ids["<|AUDIO_OUT|>"], audio_bos_token_id=ids["<|audio_out_bos|>"],
        audio_delay_token_id=ids["<|reserved_special_token_6|>"])
    torch.manual_seed(seed)
    model = HiggsAudioV2ForConditionalGeneration(config).float().eval()
    # Greedy codes then vary from frame to frame (a default init repeats one code).
    init_varied_decoder(model, seed, final_norm="model.norm")
    model.save_pretrained(out_dir, safe_serialization=True)
    # As the conversion script's, without its repetition-aware sampling (ras_win_len), which
    # resamples even greedy requests at random, so greedy parity is exact.
    GenerationConfig(bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id,
                     pad_token_id=config.pad_token_id).save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    build_audio_tokenizer(out_dir / "audio_tokenizer", seed)
    feature_extractor = DacFeatureExtractor(feature_size=1, hop_length=1, padding_side="right", padding_value=0.0,
                                            sampling_rate=HIGGS_SAMPLE_RATE, return_attention_mask=True)
    processor = {
        "processor_class": "HiggsAudioV2Processor",
        "feature_extractor": feature_extractor.to_dict(),
        # A path relative to the model folder (the real checkpoint names a hub repo).
        "audio_tokenizer": {"audio_tokenizer_class": "HiggsAudioV2TokenizerModel",
                            "audio_tokenizer_name_or_path": "audio_tokenizer"},
        "audio_stream_bos_id": codec_size, "audio_stream_eos_id": codec_size + 1,
    }
    (out_dir / "processor_config.json").write_text(json.dumps(processor, indent=2, sort_keys=True) + "\n")
    (out_dir / "chat_template.jinja").write_text(HIGGS_CHAT_TEMPLATE)


register_zoo_model(ZooModel(
    name="higgs-audio-v2",
    kind="speech",
    reference_class="transformers.HiggsAudioV2ForConditionalGeneration",
    builder=build_higgs_audio,
    sizes=("tiny",),
    description="Higgs-Audio v2 DualFFN Llama (4 x 32 codes, delay pattern) + its audio tokenizer (DAC decoder, "
                "24 kHz) in audio_tokenizer/, fp32.",
))
