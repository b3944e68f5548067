"""Media URLs in requests: fetched only from allowed hosts, https unless http is allowed,
public addresses only (checked after DNS, and connected to as checked), redirects on the
same host only, a size cap and a timeout; file:// only under the allowed folder.

A local HTTP server on 127.0.0.1 plays the media host: allowed explicitly by its IP, and
refused by default."""

from __future__ import annotations

import base64
import http.server
import io
import threading
import time

import numpy as np
import pytest
import soundfile as sf
from PIL import Image

from omnistage.entrypoints.openai.media_fetch import MediaFetcher, MediaFetchError


def _png(size=(24, 16)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, (200, 30, 30)).save(buf, "PNG")
    return buf.getvalue()


def _wav() -> bytes:
    buf = io.BytesIO()
    sf.write(buf, np.zeros(800, dtype=np.float32), 16000, format="WAV")
    return buf.getvalue()


class MediaHost(http.server.BaseHTTPRequestHandler):
    files = {"/a.png": _png(), "/big.png": _png((900, 900)), "/v.wav": _wav()}

    def do_GET(self):  # noqa: N802 - http.server's name
        port = self.server.server_address[1]
        if self.path == "/same-host-redirect":
            self._redirect(f"http://127.0.0.1:{port}/a.png")
        elif self.path == "/other-host-redirect":
            self._redirect(f"http://localhost:{port}/a.png")
        elif self.path == "/slow":
            self.send_response(200)
            self.end_headers()
            for _ in range(40):
                self.wfile.write(b"x" * 10)
                self.wfile.flush()
                time.sleep(0.05)
        elif self.path in self.files:
            self.send_response(200)
            self.send_header("content-type", "application/octet-stream")
            self.send_header("content-length", str(len(self.files[self.path])))
            self.end_headers()
            self.wfile.write(self.files[self.path])
        else:
            self.send_response(404)
            self.end_headers()

    def _redirect(self, location: str) -> None:
        self.send_response(302)
        self.send_header("location", location)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def host():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), MediaHost)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def chat_image(http, url: str):
    return http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": [
        {"type": "text", "text": "x"}, {"type": "image_url", "image_url": {"url": url}}]}]})


def test_media_urls_are_refused_by_default(app_client, host):
    http, engine = app_client("image")
    resp = chat_image(http, f"{host}/a.png")
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert error["code"] == "invalid_media_url" and "--allowed-media-domains" in error["message"]
    assert error["param"] == "messages[0].content[1]" and not engine.requests


def test_an_allowed_host_is_fetched_for_chat_images_and_audio(app_client, host):
    http, engine = app_client("image", allowed_media_domains=("http://127.0.0.1",))
    resp = chat_image(http, f"{host}/a.png")
    assert resp.status_code == 200, resp.text
    prompt, _, _ = engine.requests[-1]
    assert prompt["image"].size == (24, 16)
    assert chat_image(http, f"{host}/same-host-redirect").status_code == 200

    text, engine = app_client("text", allowed_media_domains=("http://127.0.0.1",))
    resp = text.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": [
        {"type": "input_audio", "input_audio": {"data": f"{host}/v.wav", "format": "wav"}}]}]})
    assert resp.status_code == 200, resp.text
    audio_part = engine.requests[-1][0]["messages"][0]["content"][0]
    assert audio_part["sample_rate"] == 16000 and len(audio_part["audio"]) == 800

    small, _ = app_client("image", allowed_media_domains=("http://127.0.0.1",), max_input_pixels=100 * 100)
    resp = chat_image(small, f"{host}/big.png")
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "image_too_large"


def fetcher(*domains, **kwargs) -> MediaFetcher:
    return MediaFetcher(domains, **kwargs)


def test_what_the_fetcher_refuses(host, tmp_path):
    port = host.rsplit(":", 1)[1]
    refusals = [
        (fetcher("127.0.0.1"), f"{host}/a.png", "only https"),  # http not allowed for the host
        (fetcher("http://10.0.0.1"), f"{host}/a.png", "not in the server's allowed media domains"),
        (fetcher("http://*"), f"{host}/a.png", "not a public address"),  # '*' is public hosts only
        # A name that resolves to loopback (DNS rebinding) is refused even when listed:
        (fetcher("http://localhost"), f"http://localhost:{port}/a.png", "non-public address"),
        (fetcher("http://media.example.com", resolver=lambda host, port: ["93.184.216.34", "10.1.2.3"]),
         "http://media.example.com/a.png", r"non-public address \(10.1.2.3\)"),
        (fetcher("http://127.0.0.1"), f"{host}/other-host-redirect", "redirects to another host"),
        (fetcher("http://127.0.0.1", max_bytes=1000), f"{host}/big.png", "over the limit"),
        (fetcher("http://127.0.0.1", timeout_s=0.5), f"{host}/slow", "took over"),
        (fetcher("http://127.0.0.1"), f"{host}/missing.png", "HTTP 404"),
        (fetcher("*"), "file:///etc/passwd", "file:// URLs are off"),
    ]
    for f, url, message in refusals:
        with pytest.raises(MediaFetchError, match=message):
            f.fetch(url, "image_url")
    assert fetcher("http://127.0.0.1").fetch(f"{host}/a.png", "image_url") == MediaHost.files["/a.png"]


def test_file_urls_only_under_the_allowed_folder(tmp_path):
    media = tmp_path / "media"
    media.mkdir()
    (media / "a.png").write_bytes(_png())
    (tmp_path / "secret.png").write_bytes(b"secret")
    (media / "link.png").symlink_to(tmp_path / "secret.png")
    f = MediaFetcher((), allowed_local_path=str(media))
    assert f.fetch(f"file://{media}/a.png", "image_url") == _png()
    for url in (f"file://{media}/../secret.png", f"file://{media}/link.png", f"file://{tmp_path}/secret.png",
                f"file://{media}/%2e%2e/secret.png"):
        with pytest.raises(MediaFetchError, match="outside the allowed local media folder"):
            f.fetch(url, "image_url")
    with pytest.raises(MediaFetchError, match="not a host"):
        f.fetch(f"file://evil.example.com{media}/a.png", "image_url")


def test_a_data_url_still_needs_no_fetching(app_client):
    http, engine = app_client("image")
    url = "data:image/png;base64," + base64.b64encode(_png()).decode()
    assert chat_image(http, url).status_code == 200


def test_a_video_input_reference_may_be_an_allowed_url(app_client, host):
    http, engine = app_client("video", allowed_media_domains=("http://127.0.0.1",))
    caps = type(http.app.state.capabilities)("fake-video", frozenset({"video"}), image_input="optional")
    http.app.state.video_serving.capabilities = caps
    form = {"prompt": "x", "size": "32x16", "num_frames": "5", "fps": "8"}
    resp = http.post("/v1/videos/sync", data={**form, "input_reference": f"{host}/a.png"})
    assert resp.status_code == 200, resp.text
    assert engine.requests[-1][0]["image"].size == (24, 16)
    resp = http.post("/v1/videos/sync", data={**form, "input_reference": "http://10.0.0.1/a.png"})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "input_reference"


@pytest.mark.parametrize("address", ["::127.0.0.1", "::ffff:127.0.0.1", "64:ff9b::127.0.0.1", "64:ff9b::a00:1",
                                     "64:ff9b:1::7f00:1", "2002:7f00:1::1", "::1"])
def test_ipv6_forms_of_private_ipv4_addresses_are_not_public(address):
    f = fetcher("http://*")
    with pytest.raises(MediaFetchError, match="not a public address"):
        f.fetch(f"http://[{address}]:8080/a.png", "image_url")
    resolved = fetcher("http://media.example.com", resolver=lambda host, port: [address])
    with pytest.raises(MediaFetchError, match="non-public address"):
        resolved.fetch("http://media.example.com/a.png", "image_url")
