"""Images routes over a fake engine, through the official openai client and raw HTTP."""

from __future__ import annotations

import base64
import io

import openai
import pytest
from PIL import Image

from omnistage.diffusion.params import DiffusionParams


def _client(test_client, api_key="none"):
    return openai.OpenAI(base_url=str(test_client.base_url) + "/v1", api_key=api_key, http_client=test_client,
                         max_retries=0)


def _png(size=(16, 16), mode="RGB") -> bytes:
    buf = io.BytesIO()
    Image.new(mode, size, (10, 20, 30) if mode == "RGB" else (10, 20, 30, 255)).save(buf, format="PNG")
    return buf.getvalue()


def test_generate_b64_and_url_with_the_openai_client(app_client):
    http, engine = app_client("image")
    client = _client(http)
    result = client.images.generate(prompt="a cat", n=2, size="32x16", response_format="b64_json",
                                    quality="hd", style="vivid", user="u1",
                                    extra_body={"num_inference_steps": 3, "seed": 7, "negative_prompt": "blur",
                                                "max_sequence_length": 32})
    assert len(result.data) == 2 and result.size == "32x16"
    assert Image.open(io.BytesIO(base64.b64decode(result.data[0].b64_json))).size == (32, 16)
    prompt, params, _ = engine.requests[-1]
    assert prompt == "a cat"
    assert params == DiffusionParams(width=32, height=16, num_outputs_per_prompt=2, num_inference_steps=3, seed=7,
                                     negative_prompt="blur", extras={"max_sequence_length": 32})

    result = client.images.generate(prompt="a dog", response_format="url")
    url = result.data[0].url
    assert url.startswith("http://testserver/files/") and len(url.rsplit("/", 1)[1]) > 40
    fetched = http.get(url)
    assert fetched.status_code == 200 and fetched.headers["content-type"] == "image/png"
    assert http.get(url[:-5] + "x.png").status_code == 404


def test_url_files_expire(app_client):
    http, _ = app_client("image", file_ttl_s=0.001)
    url = http.post("/v1/images/generations", json={"prompt": "x", "response_format": "url"}).json()["data"][0]["url"]
    import time

    time.sleep(0.01)
    resp = http.get(url)
    assert resp.status_code == 404 and resp.json()["error"]["code"] == "file_not_found"


@pytest.mark.parametrize("body, param", [
    ({"prompt": "x", "size": "big"}, "size"),
    ({"prompt": "x", "size": "4x4"}, "size"),
    ({"prompt": "x", "size": "4096x4096"}, "size"),
    ({"prompt": "x", "n": 0}, "n"),
    ({"prompt": "x", "n": 9}, "n"),
    ({"prompt": "x", "response_format": "file"}, "response_format"),
    ({"prompt": ""}, "prompt"),
    ({"size": "64x64"}, "prompt"),
    ({"prompt": "x", "num_inference_steps": 0}, "num_inference_steps"),
])
def test_generate_rejects_bad_fields_with_openai_errors(app_client, body, param):
    http, engine = app_client("image")
    resp = http.post("/v1/images/generations", json=body)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error" and error["message"]
    assert set(error) == {"message", "type", "param", "code"}
    assert engine.requests == []


def test_unknown_fields_and_content_types(app_client):
    http, engine = app_client("image")
    resp = http.post("/v1/images/generations", json={"prompt": "x", "colour": "red"})
    assert resp.status_code == 400 and "colour" in resp.json()["error"]["message"]
    resp = http.post("/v1/images/generations", content="prompt=x", headers={"content-type": "text/plain"})
    assert resp.status_code == 415 and resp.json()["error"]["code"] == "unsupported_media_type"
    resp = http.post("/v1/images/generations", content="{not json", headers={"content-type": "application/json"})
    assert resp.status_code == 400 and "JSON" in resp.json()["error"]["message"]
    resp = http.post("/v1/images/edits", json={"prompt": "x"})
    assert resp.status_code == 415
    assert engine.requests == []


def test_model_name_is_checked(app_client):
    http, _ = app_client("image")
    assert http.post("/v1/images/generations", json={"prompt": "x", "model": "fake-image"}).status_code == 200
    resp = http.post("/v1/images/generations", json={"prompt": "x", "model": "dall-e-3"})
    assert resp.status_code == 404 and resp.json()["error"]["code"] == "model_not_found"


def test_edit_with_several_images_and_a_mask(app_client):
    http, engine = app_client("image")
    client = _client(http)
    result = client.images.edit(image=[("a.png", _png(), "image/png"), ("b.png", _png((8, 8)), "image/png")],
                                prompt="make it blue", n=2, size="16x16", response_format="b64_json",
                                extra_body={"seed": 3, "max_sequence_length": 16})
    assert len(result.data) == 2
    prompt, params, _ = engine.requests[-1]
    assert prompt["prompt"] == "make it blue" and len(prompt["image"]) == 2
    assert params.seed == 3 and params.extras == {"max_sequence_length": 16} and params.num_outputs_per_prompt == 2

    # One image, OpenAI's mask (transparent = edit here): opaque pixels keep the original.
    mask = Image.new("RGBA", (16, 16), (0, 0, 0, 255))
    mask.paste((0, 0, 0, 0), (0, 0, 8, 16))
    buf = io.BytesIO()
    mask.save(buf, format="PNG")
    result = client.images.edit(image=("a.png", _png(), "image/png"), mask=("m.png", buf.getvalue(), "image/png"),
                                prompt="x", size="16x16")
    out = Image.open(io.BytesIO(base64.b64decode(result.data[0].b64_json))).convert("RGB")
    assert out.getpixel((12, 8)) == (10, 20, 30)  # kept
    assert out.getpixel((2, 8)) == (0, 100, 200)  # edited (the fake's colour)
    assert not isinstance(engine.requests[-1][0]["image"], list)


def test_edit_errors(app_client):
    http, engine = app_client("image")
    resp = http.post("/v1/images/edits", data={"prompt": "x"}, files={"mask": ("m.png", _png(), "image/png")})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "image"
    resp = http.post("/v1/images/edits", data={"prompt": "x"}, files={"image": ("a.png", b"not an image", "image/png")})
    assert resp.status_code == 400 and "not a decodable image" in resp.json()["error"]["message"]
    resp = http.post("/v1/images/edits", data={"prompt": "x"},
                     files=[("image", ("a.png", _png(), "image/png")), ("mask", ("m.png", _png(), "image/png"))])
    assert resp.status_code == 400 and "alpha" in resp.json()["error"]["message"]
    image = {"image": ("a.png", _png(), "image/png")}
    resp = http.post("/v1/images/edits", data={"prompt": "x", "n": "abc"}, files=image)
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "n"
    resp = http.post("/v1/images/edits", data={"prompt": "x", "bogus": "1"}, files=image)
    assert resp.status_code == 400 and "bogus" in resp.json()["error"]["message"]
    assert engine.requests == []


def test_upload_over_the_limit_is_413(app_client):
    http, engine = app_client("image", max_upload_bytes=2000)
    resp = http.post("/v1/images/edits", data={"prompt": "x"}, files={"image": ("a.png", b"\0" * 5000, "image/png")})
    assert resp.status_code == 413 and resp.json()["error"]["code"] == "request_too_large"

    def chunks():  # no Content-Length: the limit applies while reading
        yield b'{"prompt": "'
        yield b"x" * 5000
        yield b'"}'

    resp = http.post("/v1/images/generations", content=chunks(), headers={"content-type": "application/json"})
    assert resp.status_code == 413
    assert engine.requests == []


def test_route_the_model_cannot_serve(app_client):
    http, _ = app_client("text")
    resp = http.post("/v1/images/generations", json={"prompt": "x"})
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert error["code"] == "unsupported_route" and "/v1/chat/completions" in error["message"]


def test_image_urls_outlive_a_restart_with_an_output_dir(app_client, tmp_path):
    first, _ = app_client("image", files_dir=str(tmp_path))
    url = first.post("/v1/images/generations", json={"prompt": "x", "response_format": "url"}).json()["data"][0]["url"]
    path = url.split("testserver", 1)[1]
    first.__exit__(None, None, None)  # the server stops
    assert list(tmp_path.glob("*.png"))
    second, _ = app_client("image", files_dir=str(tmp_path))
    resp = second.get(path)
    assert resp.status_code == 200 and resp.content.startswith(b"\x89PNG")
    expired, _ = app_client("image", files_dir=str(tmp_path), file_ttl_s=1e-9)
    assert expired.get(path).status_code == 404 and not list(tmp_path.glob("*.png"))
