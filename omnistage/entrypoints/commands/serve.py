"""`omnistage serve [MODEL]`: start the OpenAI-compatible server.

With no MODEL it serves the embedded demo: the zoo's tiny Z-Image, built once into the
user cache dir. Its weights are random, so its images are noise; it exists so that a
fresh machine can try every route without downloading anything.
"""

from __future__ import annotations

import argparse

DEMO_MODEL = "z-image"


def register(subparsers) -> None:
    p = subparsers.add_parser("serve", help="start the OpenAI-compatible server")
    p.add_argument("model", nargs="?", default=None,
                   help="model folder or hub id (default: the embedded tiny demo model)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", default=None)
    p.set_defaults(func=run)


def resolve_model(model: str | None) -> tuple[str, str, bool]:
    """(model path, served name, is_demo)."""
    if model:
        return model, model, False
    from omnistage.testing import ensure

    print(f"[omnistage] no model given: building the tiny demo model {DEMO_MODEL!r} (once, cached)")
    path = ensure(DEMO_MODEL)
    return str(path), f"omnistage-demo-{DEMO_MODEL}", True


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from omnistage.entrypoints.openai.api_server import ServerSettings, create_app

    path, name, is_demo = resolve_model(args.model)
    name = args.served_model_name or name
    app = create_app(ServerSettings(served_model_name=name, model_path=path))
    url = f"http://{args.host}:{args.port}"
    print(f"[omnistage] serving {name} at {url}")
    if is_demo:
        print("[omnistage] the demo model has random weights: its images are noise.")
    print(f"[omnistage] try: curl {url}/v1/models")
    uvicorn.run(app, host=args.host, port=args.port, log_level="info")
    return 0
