"""POST /v1/audio/generate over a real Stable Audio engine (the tiny zoo model, in process):
every response format of speech, the duration and seed honoured, bad fields a 400 naming
the field, and the route shown by /v1/models and the OpenAPI schema (and speech refused).

The official `openai` client has no method for this route; its generic `post` sends it."""

from __future__ import annotations

import io

import av
import httpx
import numpy as np
import openai
import pytest
import soundfile as sf
from fastapi.testclient import TestClient

from omnistage import Omni
from omnistage.entrypoints.openai.api_server import create_app
from omnistage.entrypoints.openai.audio.serving import opus_available
from omnistage.entrypoints.openai.capabilities import Capabilities
from omnistage.entrypoints.openai.settings import ServerSettings
from omnistage.models.stable_audio import STABLE_AUDIO

pytestmark = pytest.mark.slow

FAST = {"num_inference_steps": 2, "seed": 3}
RATE = 8000  # the tiny zoo model's VAE rate


@pytest.fixture(scope="module")
def http(zoo):
    path = zoo("stable-audio")
    with Omni(path) as omni:
        app = create_app(ServerSettings(served_model_name="stable-audio", model_path=str(path)), omni.async_omni)
        with TestClient(app) as client:
            yield client


def generate(http, **fields):
    return http.post("/v1/audio/generate", json={"prompt": "a hammer on wood", **FAST, **fields})


def wav(response) -> np.ndarray:
    audio, rate = sf.read(io.BytesIO(response.content), dtype="float32")
    assert rate == RATE
    return audio


def test_wav_is_stereo_of_the_asked_duration_and_reproducible(http):
    response = generate(http, duration_seconds=0.5)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "audio/wav"
    assert (response.headers["x-sample-rate"], response.headers["x-audio-channels"]) == (str(RATE), "2")
    audio = wav(response)
    assert audio.shape == (4000, 2) and np.abs(audio).max() > 0
    assert generate(http, duration_seconds=0.5).content == response.content  # same seed, same audio
    assert generate(http, duration_seconds=0.5, seed=4).content != response.content
    # A later window of the same length: the model's audio_start_in_s extra passes through.
    assert wav(generate(http, duration_seconds=0.5, audio_start_in_s=0.25)).shape == (4000, 2)
    # No duration: the model's whole window (128 latent frames x 64 samples).
    assert wav(generate(http)).shape == (8192, 2)


def test_the_reference_field_names_input_and_audio_length(http):
    ours = generate(http, duration_seconds=0.5)
    theirs = http.post("/v1/audio/generate", json={"input": "a hammer on wood", "audio_length": 0.5, **FAST})
    assert theirs.status_code == 200, theirs.text
    assert theirs.content == ours.content  # the same request under vLLM-Omni's names
    same = generate(http, input="a hammer on wood", duration_seconds=0.5, audio_length=0.5)
    assert same.content == ours.content  # both names, one value: fine


@pytest.mark.parametrize("fmt", ["flac", "mp3"])
def test_soundfile_formats_decode(http, fmt):
    response = generate(http, duration_seconds=0.5, response_format=fmt)
    assert response.status_code == 200, response.text
    audio, rate = sf.read(io.BytesIO(response.content), dtype="float32")
    assert rate == RATE and audio.shape[1] == 2 and abs(len(audio) - 4000) < 1200  # mp3 pads its frames


def test_pcm_is_interleaved_int16(http):
    pcm = generate(http, duration_seconds=0.5, response_format="pcm")
    assert pcm.headers["content-type"] == "audio/pcm" and len(pcm.content) == 4000 * 2 * 2
    samples = np.frombuffer(pcm.content, dtype="<i2").reshape(-1, 2) / 32767
    expected = np.clip(wav(generate(http, duration_seconds=0.5)), -1, 1)
    assert np.abs(samples - expected).max() < 1e-3


@pytest.mark.parametrize("fmt, container", [("opus", "ogg"), ("aac", "adts")])
def test_pyav_formats_decode(http, fmt, container):
    if fmt == "opus" and not opus_available():
        pytest.skip("this PyAV has no libopus")
    response = generate(http, duration_seconds=0.5, response_format=fmt)
    assert response.status_code == 200, response.text
    with av.open(io.BytesIO(response.content), format=container) as decoded:
        stream = decoded.streams.audio[0]
        assert stream.codec_context.layout.name == "stereo"
        assert sum(frame.samples for frame in decoded.decode(stream)) > 0
    assert response.headers["x-sample-rate"] == ("48000" if fmt == "opus" else str(RATE))


@pytest.mark.parametrize("fields, param", [
    ({"duration_seconds": 5.0}, "duration_seconds"),  # longer than the tiny model's 1.024 s window
    ({"duration_seconds": 0}, "duration_seconds"),
    ({"duration_seconds": 0.5, "audio_end_in_s": 0.5}, "duration_seconds"),
    ({"response_format": "ogg"}, "response_format"),
    ({"num_inference_steps": 0}, "num_inference_steps"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": None}, "prompt"),
    ({"input": "a drum"}, "input"),  # vLLM-Omni's name for prompt, saying otherwise
    ({"duration_seconds": 0.5, "audio_length": 0.25}, "audio_length"),
    ({"audio_length": 5.0}, "audio_length"),
    ({"voice": "alloy"}, "voice"),  # not a field of the route nor an extra of the model
    ({"true_cfg_scale": 2.0}, "true_cfg_scale"),
])
def test_bad_fields_are_a_400_naming_them(http, fields, param):
    response = generate(http, **fields)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["param"] == param


def test_route_is_listed_and_speech_is_refused_through_the_openai_client(http):
    client = openai.OpenAI(base_url=str(http.base_url) + "/v1", api_key="none", http_client=http, max_retries=0)
    (model,) = client.models.list().data
    assert model.routes == ["POST /v1/audio/generate"]
    assert model.modalities == {"input": ["text"], "output": ["audio"]}
    audio = client.post("/audio/generate", body={"prompt": "rain", **FAST, "response_format": "flac"},
                        cast_to=httpx.Response)
    assert sf.info(io.BytesIO(audio.content)).channels == 2
    with pytest.raises(openai.BadRequestError, match="does not serve POST /v1/audio/speech"):
        client.audio.speech.create(model="stable-audio", input="hello", voice="alloy")
    with pytest.raises(openai.BadRequestError, match="does not serve"):
        client.images.generate(prompt="a cat")

    operation = http.get("/openapi.json").json()["paths"]["/v1/audio/generate"]["post"]
    assert {"audio/wav", "audio/mpeg", "audio/flac"} <= set(operation["responses"]["200"]["content"])
    assert "400" in operation["responses"] and "422" not in operation["responses"]


def test_capabilities_tell_generated_audio_from_speech():
    from omnistage.models.csm import CSM

    sound = Capabilities.from_spec("sa", STABLE_AUDIO)
    assert sound.serves("audio.generate") and not sound.serves("audio.speech")
    speech = Capabilities.from_spec("tts", CSM)
    assert speech.serves("audio.speech") and not speech.serves("audio.generate")
