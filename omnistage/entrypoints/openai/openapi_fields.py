"""Descriptions and examples of the request fields in /openapi.json, and each route's extension
fields (those beyond OpenAI's, which the `openai` client sends through `extra_body`).

`openapi.py` applies them to the document FastAPI builds from the pydantic request models.
`tests/entrypoints/openai/test_openapi_fields.py` checks that every property of every request
schema gets a description here and that no entry names a field the models lack, so a new
request field cannot reach the document undescribed.
"""

from __future__ import annotations

from typing import Any

# (description, example or None). Fields many request models share: described once.
COMMON: dict[str, tuple[str, Any]] = {
    "model": ("The served model's id (`GET /v1/models`); another id is a 404, except on chat and completions "
              "of a text model the name of a LoRA adapter its first stage serves (vLLM's convention: the same "
              "as `lora: {\"name\": ...}`). Optional: the server serves one model.", "omnistage-demo-z-image"),
    "prompt": ("What to generate, in words.", "a lighthouse at dusk"),
    "negative_prompt": ("Diffusion: what the image, video or audio should not show; runs the "
                        "unconditional branch of classifier-free guidance with it.", "blurry, low quality"),
    "num_inference_steps": ("Diffusion: denoising steps. Default: the stage's `defaults` in `/v1/models` "
                            "(the deploy file's, else the checkpoint's).", 4),
    "guidance_scale": ("Diffusion: classifier-free guidance scale (or the distilled guidance embedding, "
                       "on families that have one).", 4.0),
    "true_cfg_scale": ("Diffusion: true CFG scale on families that separate it from guidance_scale "
                       "(FLUX, Qwen-Image); > 1 with a negative prompt turns it on.", 4.0),
    "seed": ("Seeds the sampling (the initial noise, or the AR sampler); with `n` > 1 sample i uses "
             "seed + i.", 0),
    "lora": ("A LoRA adapter by name and its scale: one the stage serves (deploy `lora_adapters`, or one "
             "loaded by path before), or a new one with its `path` (diffusion: a diffusers LoRA file; a text "
             "model's native AR stage: a peft adapter folder), loaded on first use (deploy `max_loras`); an "
             "unknown name or a bad file is a 400.", {"name": "ink", "scale": 0.5}),
    "n": ("How many outputs; at most the server's `--max-n`.", 1),
    "stream": ("Answer as Server-Sent Events.", False),
    "stream_options": ("With `stream`: `include_usage` adds a final chunk with `usage`.", {"include_usage": True}),
    "user": ("Accepted for OpenAI compatibility and ignored.", None),
    "size": ("`WIDTHxHEIGHT` of each image; each side a multiple the model accepts, the area at most "
             "`--max-pixels`.", "256x256"),
    "stop": ("A string or up to several strings that end the text when generated (not included).", ["\n\n"]),
    "temperature": ("Sampling temperature; 0 is greedy.", 0.7),
    "top_p": ("Nucleus sampling: the smallest set of tokens whose probability reaches top_p.", 0.9),
    "frequency_penalty": ("Lowers a token's logit by this times its count in the output so far.", 0.0),
    "presence_penalty": ("Lowers a token's logit by this once it appeared in the output.", 0.0),
    "max_tokens": ("Most tokens to generate.", 64),
    "response_format": ("The encoding of the answer.", None),
    "type": ("The kind of this item.", None),
    "name": ("A name.", None),
    "url": ("A `data:` URL (base64), or an http(s) URL on a host the server allows "
            "(`--allowed-media-domains`; `file://` under `--allowed-local-media-path`).",
            "data:image/png;base64,iVBORw0KGgo..."),
}

# Per schema: fields whose meaning differs from COMMON, or that only that schema has.
FIELDS: dict[str, dict[str, tuple[str, Any]]] = {
    "ImageGenerationRequest": {
        "response_format": ("`b64_json` (the PNG/JPEG/WebP inline) or `url` (a `/files/...` link that "
                            "expires after `--file-ttl`).", "b64_json"),
        "output_format": ("The image encoding.", "png"),
        "quality": ("Accepted and ignored: a diffusion model has no such switch.", None),
        "style": ("Accepted and ignored: a diffusion model has no such switch.", None),
        "partial_images": ("With `stream`: previews decoded from the latents at evenly spaced steps, "
                           "sent as `image_generation.partial_image` events (0-3).", 2),
    },
    "ChatCompletionRequest": {
        "messages": ("The conversation: `system`/`developer`, `user`, `assistant` and `tool` messages; user "
                     "content may mix text, `image_url`, `input_audio`, `audio_url` and `video_url` parts.",
                     [{"role": "user", "content": "Hello!"}]),
        "modalities": ("Outputs to make: `[\"text\"]` runs an omni model's thinker alone, "
                       "`[\"text\", \"audio\"]` every stage.", ["text", "audio"]),
        "audio": ("With audio in `modalities`: the voice and the encoding of `message.audio`.",
                  {"voice": "Chelsie", "format": "wav"}),
        "mm_processor_kwargs": ("Omni models: `use_audio_in_video` makes the model hear a video part's own "
                                "audio track.", {"use_audio_in_video": True}),
        "max_tokens": ("Most tokens to generate; without it a reply runs until the model stops.", 64),
        "max_completion_tokens": ("OpenAI's newer name for max_tokens.", 64),
        "logprobs": ("Return each sampled token's log probability (from the sampler's processed "
                     "distribution).", False),
        "top_logprobs": ("With logprobs: the most likely alternatives per token (0-20).", 2),
        "response_format": ("Structured output: `json_object`, or `json_schema` with a schema the reply "
                            "must follow (a grammar mask in the sampler).", {"type": "json_object"}),
        "tools": ("Functions the model may call (text models); the chat template gets them.",
                  [{"type": "function", "function": {"name": "get_weather",
                                                     "parameters": {"type": "object", "properties": {}}}}]),
        "tool_choice": ("`none`, `auto` (the family's parser finds calls in the text), `required`, or a "
                        "named function (both written through the grammar, so they always parse).", "auto"),
        "parallel_tool_calls": ("false allows at most one call.", True),
        "size": ("Image models: `WIDTHxHEIGHT` of the image the reply carries.", "256x256"),
    },
    "CompletionRequest": {
        "prompt": ("A string, a list of strings, token ids, or lists of token ids.", "Once upon a time"),
        "suffix": ("Refused (400): no model served here inserts text.", None),
        "max_tokens": ("Most tokens to generate (default: the deploy file's, else 16).", 16),
        "best_of": ("Sample best_of completions per prompt and return the n with the highest total log "
                    "probability (>= n; not with stream).", 1),
        "logprobs": ("Return the log probabilities of the sampled token and of this many alternatives (0-5).", 1),
        "echo": ("Put the prompt before the completion (text prompts).", False),
        "logit_bias": ("Only null: a bias is refused (400).", None),
    },
    "SleepRequest": {
        "level": ("1: every stage's weights moved to host memory and its caches freed; 2: the weights' storage "
                  "freed too, read back from the stage's checkpoint folder (or the last update_weights path) on "
                  "wake-up.", 1),
        "timeout_s": ("Longest wait for the running requests to finish before the stages sleep; new requests "
                      "get 503 + Retry-After from the moment this one arrives.", 300.0),
    },
    "UpdateWeightsRequest": {
        "stage": ("The stage to update, by name or id.", "llm"),
        "path": ("A checkpoint folder on the server: safetensors named as the stage's weights (a diffusion "
                 "stage: a pipeline folder whose component subfolders hold them).", "/checkpoints/step-1000"),
        "timeout_s": ("Longest wait for the running requests to finish on the old weights; requests arriving "
                      "meanwhile wait and run on the new ones.", 300.0),
    },
    "LoadLoraAdapterRequest": {
        "name": ("The name requests give in `lora: {\"name\": ...}`.", "ink"),
        "path": ("Where the adapter is on the server: for a diffusion stage a LoRA file in diffusers' safetensors "
                 "format, for a text model's native AR stage a peft adapter folder (a bad one is a 400 naming "
                 "`path` and loads nothing).", "/loras/ink.safetensors"),
    },
    "SpeechRequest": {
        "input": ("The text to read aloud.", "Hello there!"),
        "voice": ("A built-in voice (CSM: alloy, echo, fable, onyx, nova, shimmer; a Qwen3-TTS CustomVoice "
                  "checkpoint's speakers) or a voice registered at `POST /v1/audio/voices`, by name or as OpenAI's "
                  "`{\"id\": name}`.", "alloy"),
        "instructions": ("How to speak; a Qwen3-TTS VoiceDesign checkpoint takes its voice from it.",
                         "A calm, low voice."),
        "response_format": ("The audio encoding; `pcm` is raw 16-bit mono at the `x-sample-rate` header's "
                            "rate.", "wav"),
        "speed": ("Playback speed, 0.25-4; other than 1 the audio is encoded once complete.", 1.0),
        "stream_format": ("`audio`: the encoded bytes (pcm and wav at speed 1 stream chunk by chunk); `sse`: "
                          "`speech.audio.delta` events, then `speech.audio.done` with usage.", "audio"),
        "ref_audio": ("Inline voice cloning: a reference clip, base64 or a data URL.", None),
        "ref_text": ("The transcript of ref_audio (or of a registered voice's clip).", None),
        "task_type": ("Qwen3-TTS: `CustomVoice`, `VoiceDesign` or `Base`; must be the checkpoint's task.",
                      "CustomVoice"),
        "stream": ("vLLM-Omni's: send the audio as the model makes it (pcm, or wav with an open-ended "
                   "header; speed 1). Other formats or speeds are a 400.", True),
        "max_new_tokens": ("vLLM-Omni's: the most codec frames the talker samples (default: the deploy's "
                           "`max_tokens`).", 200),
        "extra_params": ("vLLM-Omni's: the model's extras as one object (Qwen3-TTS: `language`, "
                         "`non_streaming_mode`; OmniVoice: `num_inference_steps`, `position_temperature`, ...), "
                         "as when sent as fields; an unknown one is a 400 naming it.", {"language": "auto"}),
        "word_timestamps": ("vLLM-Omni's: no speech model served here produces word alignments, so `true` is "
                            "a 400 naming this field.", False),
    },
    "SpeechBatchRequest": {
        "items": ("Up to 32 speech requests (each at least `input`, with any field of `POST /v1/audio/speech` "
                  "but `stream` and `stream_format`); each is answered in its own result, in order.",
                  [{"input": "Hello."}, {"input": "Goodbye.", "voice": "nova"}]),
        "response_format": ("The audio encoding of every item (an item's own wins).", "wav"),
    },
    "AudioGenerateRequest": {
        "duration_seconds": ("Length of the audio; default and maximum: the model's whole window "
                             "(47.55 s for Stable Audio Open).", 10.0),
        "audio_length": ("vLLM-Omni's name for `duration_seconds` (both and different: a 400).", None),
        "input": ("vLLM-Omni's name for `prompt` (both and different: a 400).", None),
        "response_format": ("The audio encoding (stereo); `pcm` is interleaved int16.", "wav"),
    },
    "TranscriptionRequest": {
        "file": ("The audio to transcribe (any format soundfile or PyAV reads; within the input audio limit).", None),
        "language": ("The spoken language (ISO-639-1): the model is asked for text in it.", "en"),
        "prompt": ("Text the audio follows on from (names, spellings), given to the model as context.", None),
        "response_format": ("`json` (`text`, `usage`), `text`, `verbose_json` (one segment: the whole clip; the "
                            "omni thinkers give no times), `srt` or `vtt`.", "json"),
        "temperature": ("Sampling temperature of the thinker (0: greedy).", 0.0),
        "stream": ("SSE `transcript.text.delta` events, then `transcript.text.done` (json and text only).", False),
        "timestamp_granularities": ("Only `segment`, with `verbose_json`.", "segment"),
    },
    "TranslationRequest": {
        "file": ("The audio to translate into English (any format soundfile or PyAV reads).", None),
        "prompt": ("English text the audio follows on from, given to the model as context.", None),
        "response_format": ("`json` (`text`, `usage`), `text`, `verbose_json` (one segment: the whole clip), "
                            "`srt` or `vtt`.", "json"),
        "temperature": ("Sampling temperature of the thinker (0: greedy).", 0.0),
    },
    "ImageEditRequest": {
        "prompt": ("The edit to make.", "make it blue"),
        "response_format": ("`b64_json` or `url` (a `/files/...` link that expires after `--file-ttl`).", "b64_json"),
        "output_format": ("The image encoding.", "png"),
        "quality": ("Accepted and ignored: a diffusion model has no such switch.", None),
        "style": ("Accepted and ignored: a diffusion model has no such switch.", None),
        "partial_images": ("With `stream`: previews sent as `image_edit.partial_image` events (0-3).", 2),
        "image": ("The input image(s), one file per part (also sent as `image[]`).", None),
        "mask": ("OpenAI's mask: an RGBA image the size of the first image, transparent where it may "
                 "change.", None),
    },
    "VideoJobRequest": {
        "prompt": ("What the video shows.", "waves on a beach"),
        "size": ("`WIDTHxHEIGHT` of the frames (or width and height).", "480x320"),
        "width": ("Frame width, instead of size.", 480),
        "height": ("Frame height, instead of size.", 320),
        "num_frames": ("Frames to make (the model's rule applies, e.g. Wan's 4k+1).", 33),
        "seconds": ("Length with fps, instead of num_frames: seconds * fps + 1 frames.", 2),
        "fps": ("Frames per second of the MP4.", 16),
        "guidance_scale_2": ("Wan 2.2: the guidance scale of the low-noise expert.", 3.0),
        "extra_params": ("The model's request extras as a JSON object.", {"max_sequence_length": 64}),
        "input_reference": ("Image-to-video models: the first frame, a file (or an allowed URL).", None),
        "input_references": ("Repeated files, each an image or a video by its Content-Type (or file name): "
                             "the model's input images in order, and its control or conditioning video.", None),
        "control_video": ("Wan-VACE, Cosmos3: the control or conditioning video, a file (or an allowed URL).",
                          None),
        "mask_video": ("Wan-VACE: the control video's mask (white: generate, black: keep).", None),
        "n": ("Videos to make; video i takes seed + i. The sync route then answers multipart/mixed.", 1),
        "audio_reference": ("For a family that conditions on audio: none served here, so a 400 naming it.", None),
    },
    "VoiceUpload": {
        "name": ("The voice's name, used as `voice` in speech requests.", "my-voice"),
        "audio_sample": ("A clip of the voice, any audio soundfile reads (resampled and mixed to mono).", None),
        "ref_text": ("The clip's transcript (Qwen3-TTS Base: its codes then join the prompt).", None),
    },
    "ResponsesRequest": {
        "input": ("A string (one user message) or a list of items: messages, `function_call` and "
                  "`function_call_output`.", "Hello!"),
        "instructions": ("A system message put first; not carried over by previous_response_id.",
                         "Answer briefly."),
        "previous_response_id": ("Continue from an earlier response's id.", None),
        "store": ("OpenAI's store flag.", True),
        "background": ("OpenAI's background flag.", False),
        "max_output_tokens": ("Most tokens to generate.", 64),
        "text": ("The text's format (text, json_object, json_schema) and verbosity.", None),
        "tools": ("Functions the model may call.", None),
        "tool_choice": ("`none`, `auto`, `required`, or a named function.", "auto"),
        "parallel_tool_calls": ("false allows at most one call.", True),
        "max_tool_calls": ("OpenAI's cap on tool calls.", None),
        "reasoning": ("Accepted and ignored: the served models take no reasoning budget.", None),
        "metadata": ("Up to 16 string pairs kept with the response.", {"ticket": "42"}),
        "safety_identifier": ("Accepted for OpenAI compatibility.", None),
        "prompt_cache_key": ("Accepted and echoed: the engine's prefix cache finds shared prefixes by "
                             "their tokens.", None),
        "truncation": ("Only `disabled`: an input over the context length is a 400, never cut.", "disabled"),
        "include": ("OpenAI's list of extra outputs to include.", None),
        "service_tier": ("`auto` or `default`.", None),
        "modalities": ("Outputs to make (omni models answer with audio too).", ["text"]),
        "audio": ("With audio in `modalities`: the voice and the encoding.", None),
        "size": ("Image models: `WIDTHxHEIGHT` of the answer image.", "256x256"),
    },
    "MessageItem": {"role": ("Who speaks.", "user"), "content": ("A string, or a list of content parts.", "Hello!"),
                    "id": ("The item's id, when sent back from an earlier response.", None),
                    "status": ("The item's status, when sent back.", None),
                    "phase": ("An assistant message's phase, when sent back.", None)},
    "FunctionCallItem": {"call_id": ("The call's id.", "call_0"), "arguments": ("The arguments as a JSON string.", "{}"),
                         "id": ("The item's id.", None), "status": ("The item's status.", None)},
    "FunctionCallOutputItem": {"call_id": ("The id of the call this answers.", "call_0"),
                               "output": ("The function's result: a string or input_text parts.", "18 C"),
                               "id": ("The item's id.", None), "status": ("The item's status.", None)},
    "OutputText": {"text": ("An earlier answer's text, sent back as history.", None),
                   "annotations": ("As the earlier answer had them.", None),
                   "logprobs": ("As the earlier answer had them.", None)},
    "InputImage": {"image_url": ("A data URL, or a URL the server may fetch.", "data:image/png;base64,..."),
                   "file_id": ("OpenAI's file id.", None), "detail": ("OpenAI's detail hint.", None)},
    "InputAudioData": {"data": ("Base64 audio.", "UklGR..."), "format": ("Its encoding.", "wav")},
    "InputFile": {"file_data": ("A file's data (audio, for models that hear).", None),
                  "file_url": ("A file's URL (audio, for models that hear).", None),
                  "file_id": ("OpenAI's file id.", None), "filename": ("The file's name.", None)},
    "Refusal": {"refusal": ("An earlier refusal, sent back as history.", None)},
    "FunctionTool": {"description": ("What the function does, for the model.", None),
                     "parameters": ("The arguments' JSON Schema.", {"type": "object", "properties": {}}),
                     "strict": ("OpenAI's strict flag.", None)},
    "TextOptions": {"format": ("`text`, `json_object`, or `json_schema` with a schema.", {"type": "json_object"}),
                    "verbosity": ("OpenAI's verbosity hint.", None)},
    "TextFormatJSONSchema": {"description": ("What the schema is for.", None),
                             "schema": ("The JSON Schema the answer must follow.", {"type": "object"}),
                             "strict": ("OpenAI's strict flag.", None)},
    "Reasoning": {"effort": ("Accepted and ignored.", None), "summary": ("Accepted and ignored.", None),
                  "generate_summary": ("Accepted and ignored.", None)},
    "ChatMessage": {
        "role": ("Who speaks.", "user"),
        "content": ("A string, or a list of content parts.", "Hello!"),
        "name": ("An optional name for the participant.", None),
        "tool_calls": ("An assistant message's calls, as the server returned them.", None),
        "tool_call_id": ("A tool message: the id of the call it answers.", None),
    },
    "TextPart": {"text": ("The text.", "What is in this picture?")},
    "ImagePart": {"image_url": ("The image: `url`, and `detail` (ignored).", {"url": "data:image/png;base64,..."})},
    "ImageURL": {"detail": ("OpenAI's detail hint: auto, low or high.", None)},
    "InputAudioPart": {"input_audio": ("Audio: base64 `data` and its `format`.", {"data": "UklGR...", "format": "wav"})},
    "InputText": {"text": ("The text.", "What is in this picture?")},
    "InputAudio": {"input_audio": ("Responses: the audio, base64 `data` and its `format`.", None),
                   "data": ("Chat: base64 audio (or an allowed URL).", "UklGR..."),
                   "format": ("The encoding: wav, mp3, flac, ...", "wav")},
    "AudioURLPart": {"audio_url": ("Audio by `url`.", {"url": "data:audio/wav;base64,..."})},
    "VideoURLPart": {"video_url": ("An encoded video by `url` (omni models sample its frames).",
                                   {"url": "data:video/mp4;base64,..."})},
    "ToolCallItem": {"id": ("The call's id.", "call_0"), "function": ("The function's name and JSON arguments.", None)},
    "FunctionCall": {"arguments": ("The arguments as a JSON string.", "{\"city\": \"Paris\"}")},
    "StreamOptions": {"include_usage": ("Chat and completions: add a final chunk with `usage`.", True),
                      "include_obfuscation": ("Responses: accepted; no obfuscation padding is added.", None)},
    "AudioOptions": {"voice": ("The voice of the spoken reply.", "Chelsie"),
                     "format": ("The encoding of `message.audio.data`; streamed audio is 24 kHz pcm16.", "wav")},
    "MMProcessorKwargs": {"use_audio_in_video": ("Hear a video part's own audio track, interleaved with its "
                                                 "frames in time.", False)},
    "ResponseFormat": {"json_schema": ("With type json_schema: the schema and its name.", None)},
    "JSONSchemaFormat": {"description": ("What the schema is for.", None),
                         "schema": ("The JSON Schema the reply must follow.", {"type": "object"}),
                         "strict": ("OpenAI's strict flag.", True)},
    "Tool": {"function": ("The function: name, description and JSON Schema parameters.", None)},
    "FunctionDefinition": {"description": ("What the function does, for the model.", None),
                           "parameters": ("The arguments' JSON Schema.", {"type": "object", "properties": {}}),
                           "strict": ("OpenAI's strict flag.", None)},
    "NamedToolChoice": {"function": ("The function the model must call.", {"name": "get_weather"})},
    "LoraRequest": {"name": ("The adapter's name: in `lora_adapters`, or one loaded by path.", "ink"),
                    "path": ("A LoRA file (diffusion) or peft adapter folder (native AR) on the server, loaded "
                             "under `name` on first use (needs the deploy field `max_loras`).",
                             "/loras/ink.safetensors"),
                    "scale": ("The adapter's weight.", 0.5)},
}
FIELDS["ChatCompletionBatchRequest"] = {
    **FIELDS["ChatCompletionRequest"],
    "messages": ("A list of conversations (each a list of messages as in /v1/chat/completions), at most 256; "
                 "each is answered in its own choice, in order.",
                 [[{"role": "user", "content": "Hello!"}], [{"role": "user", "content": "Bonjour !"}]]),
}
"""The batch route takes chat's fields, with `messages` a list of conversations."""

# Extension fields a route reads beyond its request model's own fields (the `openai` client:
# `extra_body={...}`): name -> (JSON type, description).
_SAMPLING_EXTRAS: dict[str, tuple[str, str]] = {
    "top_k": ("integer", "vLLM's: sample among the k most likely tokens."),
    "min_p": ("number", "vLLM's: drop tokens below min_p times the top token's probability."),
    "repetition_penalty": ("number", "vLLM's: divides the logits of tokens already in prompt or output."),
    "min_tokens": ("integer", "vLLM's: no end of sequence before this many tokens."),
    "stop_token_ids": ("array", "vLLM's: token ids that end the output."),
    "ignore_eos": ("boolean", "vLLM's: keep generating past the end-of-sequence token."),
    "structured_outputs": ("object", "vLLM's: one of `json`, `json_object`, `regex`, `choice`, `grammar`; "
                                     "the output follows it (a grammar mask)."),
    "guided_json": ("object", "vLLM's older spelling of structured_outputs.json."),
    "guided_regex": ("string", "vLLM's older spelling of structured_outputs.regex."),
    "guided_choice": ("array", "vLLM's older spelling of structured_outputs.choice."),
    "guided_grammar": ("string", "vLLM's older spelling of structured_outputs.grammar."),
}
_MODEL_EXTRAS = ("object", "The model's declared request extras, each a top-level field (e.g. "
                           "`max_sequence_length`; Stable Audio: `audio_start_in_s`). Unknown ones are a 400.")

_SPEECH_EXTRAS = ("object", "The model's declared request extras, each a top-level field (Qwen3-TTS: "
                            "`language`, `non_streaming_mode`). Unknown ones are a 400.")

EXTENSIONS: dict[tuple[str, str], dict[str, tuple[str, str]]] = {
    ("post", "/v1/chat/completions"): {**_SAMPLING_EXTRAS, "<model extras>": _MODEL_EXTRAS},
    ("post", "/v1/chat/completions/batch"): {**_SAMPLING_EXTRAS, "<model extras>": _MODEL_EXTRAS},
    ("post", "/v1/completions"): dict(_SAMPLING_EXTRAS),
    ("post", "/v1/responses"): dict(_SAMPLING_EXTRAS),
    ("post", "/v1/images/generations"): {"<model extras>": _MODEL_EXTRAS},
    ("post", "/v1/audio/generate"): {"<model extras>": _MODEL_EXTRAS},
    ("post", "/v1/audio/speech"): {"<model extras>": _SPEECH_EXTRAS},
    ("post", "/v1/audio/speech/batch"): {
        "<speech fields>": ("object", "Any field of `POST /v1/audio/speech` but `input`, `stream` and `stream_format`: "
                                      "a default every item takes unless it sends its own."),
        "<model extras>": _SPEECH_EXTRAS},
}


# Multipart routes read their form themselves; the document gets their body from the pydantic
# model of the text fields plus the file fields: path -> (model, file fields).
_IMAGE_EDIT = ("omnistage.entrypoints.openai.images.protocol:ImageEditRequest", ("image", "mask"))
_VIDEO = ("omnistage.entrypoints.openai.videos.protocol:VideoJobRequest",
          ("input_reference", "input_references", "control_video", "mask_video"))
FORMS: dict[str, tuple[str, tuple[str, ...]]] = {
    "/v1/images/edits": _IMAGE_EDIT, "/v1/videos": _VIDEO, "/v1/videos/sync": _VIDEO,
    "/v1/audio/transcriptions": ("omnistage.entrypoints.openai.audio.protocol:TranscriptionRequest", ("file",)),
    "/v1/audio/translations": ("omnistage.entrypoints.openai.audio.protocol:TranslationRequest", ("file",)),
}
VOICE_UPLOAD: dict[str, Any] = {
    "title": "VoiceUpload", "type": "object", "required": ["name", "audio_sample"],
    "properties": {"name": {"type": "string"}, "audio_sample": {"type": "string", "format": "binary"},
                   "ref_text": {"type": "string"}},
}


def add_form_bodies(document: dict[str, Any]) -> None:
    """Give each multipart route its `multipart/form-data` body schema."""
    import importlib

    schemas = document["components"]["schemas"]
    bodies = {"/v1/audio/voices": "VoiceUpload"}
    schemas["VoiceUpload"] = VOICE_UPLOAD
    for path, (target, files) in FORMS.items():
        module, name = target.split(":")
        schema = getattr(importlib.import_module(module), name).model_json_schema(
            ref_template="#/components/schemas/{model}")
        schemas.update(schema.pop("$defs", {}))
        for field in files:
            schema["properties"][field] = {"type": "string", "format": "binary"}
        schemas[name] = schema
        bodies[path] = name
    for path, name in bodies.items():
        operation = document["paths"].get(path, {}).get("post")
        if operation is not None:
            operation["requestBody"] = {"required": True, "content": {
                "multipart/form-data": {"schema": {"$ref": f"#/components/schemas/{name}"}}}}


def short_name(schema_name: str) -> str:
    """pydantic names a schema by its module too when two models share a name
    (`omnistage__..__chat__protocol__InputAudio`); the entries here use the model's name."""
    return schema_name.rsplit("__", 1)[-1]


def describe(schemas: dict[str, Any]) -> None:
    """Fill in the description and example of every request-schema property we document."""
    for full_name, schema in schemas.items():
        name = short_name(full_name)
        for field, prop in schema.get("properties", {}).items():
            entry = FIELDS.get(name, {}).get(field) or (COMMON.get(field) if _is_request(name) else None)
            if entry is None:
                continue
            description, example = entry
            prop.setdefault("description", description)
            if example is not None:
                prop.setdefault("examples", [example])


def describe_extensions(method: str, path: str, operation: dict[str, Any]) -> None:
    """List the route's extension fields under `x-extra-body` (JSON Schema by field)."""
    extras = EXTENSIONS.get((method, path))
    if extras:
        operation["x-extra-body"] = {name: {"type": tp, "description": text} for name, (tp, text) in extras.items()}


def _is_request(schema_name: str) -> bool:
    return schema_name in FIELDS or schema_name in REQUEST_SCHEMAS


REQUEST_SCHEMAS = {"ImageGenerationRequest", "ImageEditRequest", "TranscriptionRequest", "TranslationRequest", "VideoJobRequest", "VoiceUpload", "ChatCompletionRequest", "CompletionRequest", "SpeechRequest",
                   "AudioGenerateRequest", "ChatMessage", "TextPart", "ImagePart", "ImageURL", "InputAudioPart",
                   "InputAudio", "AudioURLPart", "AudioURL", "VideoURLPart", "VideoURL", "ToolCallItem",
                   "FunctionCall", "StreamOptions", "AudioOptions", "MMProcessorKwargs", "ResponseFormat",
                   "JSONSchemaFormat", "Tool", "FunctionDefinition", "NamedToolChoice", "NamedFunction", "LoraRequest",
                   "ResponsesRequest", "MessageItem", "FunctionCallItem", "FunctionCallOutputItem", "InputText",
                   "OutputText", "InputImage", "InputAudioData", "InputFile", "Refusal", "FunctionTool",
                   "TextOptions", "TextFormatText", "TextFormatJSONObject", "TextFormatJSONSchema", "Reasoning",
                   "SleepRequest", "UpdateWeightsRequest", "LoadLoraAdapterRequest", "ChatCompletionBatchRequest",
                   "SpeechBatchRequest"}
"""The schemas a request body may contain (the others describe answers)."""
