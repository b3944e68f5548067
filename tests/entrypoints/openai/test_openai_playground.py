"""The playground's serving side over a fake engine: the page at `/`, its assets, the
`stages` it shows, and `--no-playground`. The page itself is tested in a browser in
tests/e2e/test_playground.py."""

from __future__ import annotations

from omnistage.entrypoints.cli import build_parser


def test_page_and_assets_are_served_without_the_api_key(app_client):
    http, _ = app_client("tts", api_key="s3cret")
    page = http.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert '<script type="module" src="/playground/app.js">' in page.text
    assert 'data-route="POST /v1/audio/speech"' in page.text
    script = http.get("/playground/app.js")
    assert script.status_code == 200 and "javascript" in script.headers["content-type"]
    assert "/v1/models" in script.text
    assert http.get("/playground/style.css").headers["content-type"].startswith("text/css")
    assert http.get("/playground/nothing.js").status_code == 404
    assert http.get("/v1/models").status_code == 401  # the page is open; the API is not


def test_models_list_the_stages_the_page_shows(app_client):
    http, engine = app_client("omni")
    model = http.get("/v1/models").json()["data"][0]
    assert model["stages"] == [{"id": s.id, "name": s.name, "kind": s.kind, "output": s.output}
                               for s in engine.spec.stages]
    assert len(model["stages"]) > 1


def test_no_playground_leaves_the_page_out(app_client):
    http, _ = app_client("image", playground=False)
    assert http.get("/").status_code == 404
    assert http.get("/playground/app.js").status_code == 404
    assert http.get("/v1/models").status_code == 200


def test_serve_flag():
    parser = build_parser()
    assert parser.parse_args(["serve", "m"]).playground is True
    assert parser.parse_args(["serve", "m", "--no-playground"]).playground is False
