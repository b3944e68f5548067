"""`omnistage serve [MODEL]`: start the OpenAI-compatible server.

With no MODEL it serves the embedded demo: the zoo's tiny Z-Image, built once into the
user cache dir. Its weights are random, so its images are noise; it exists so that a
fresh machine can try every route without downloading anything.

SIGINT and SIGTERM stop it gracefully: no new connections, in-flight requests get
`--graceful-timeout` seconds to finish (streams still open a moment before it ends get a
closing error event: SSE `error`, WebSocket close 1001; then they are cancelled and their engine
requests aborted), video jobs are cancelled, the engine and its stage processes stop,
and the process exits 0.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from typing import Any

DEMO_MODEL = "z-image"
DEMO_DEPLOY = "z_image_demo.yaml"
"""The demo's bundled deploy file: defaults that answer in about a second on a CPU."""


def register(subparsers) -> None:
    from omnistage.entrypoints.openai.settings import ServerSettings

    defaults = ServerSettings(served_model_name="", model_path="")
    p = subparsers.add_parser("serve", help="start the OpenAI-compatible server")
    p.add_argument("model", nargs="?", default=None,
                   help="model folder or hub id (default: the embedded tiny demo model)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", default=None,
                   help="the model id /v1/models lists and requests may name (default: MODEL)")
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on every /v1 route")
    p.add_argument("--deploy-config", default=None, help="deploy YAML (default: the model family's bundled one)")
    p.add_argument("--stage-overrides", default=None,
                   help="per-stage deploy fields as JSON, e.g. "
                        '\'{"0": {"max_num_seqs": 4}, "*": {"dtype": "float32"}}\'')
    limits = p.add_argument_group("limits")
    limits.add_argument("--max-upload-bytes", type=int, default=defaults.max_upload_bytes,
                        help="largest request body; larger ones get 413 (default: %(default)s)")
    limits.add_argument("--max-n", type=int, default=defaults.max_n,
                        help="most images or videos one request may ask for, `n` (default: %(default)s)")
    limits.add_argument("--max-pixels", type=int, default=defaults.max_pixels,
                        help="largest width*height per image or video frame (default: %(default)s)")
    limits.add_argument("--max-input-pixels", type=int, default=defaults.max_input_pixels,
                        help="largest width*height of an input image (edits, chat image_url, video references); "
                             "refused from its header before decoding (default: %(default)s)")
    limits.add_argument("--max-queued-requests", type=int, default=defaults.max_queued_requests,
                        help="requests in the engine at once; more get 429 (default: %(default)s)")
    limits.add_argument("--file-ttl", type=float, default=defaults.file_ttl_s,
                        help="seconds that image URLs and finished videos stay downloadable (default: %(default)s)")
    limits.add_argument("--realtime-max-session", type=float, default=defaults.realtime_max_session_s,
                        metavar="SECONDS", help="longest WS /v1/realtime session (default: %(default)s)")
    limits.add_argument("--realtime-max-buffer", type=float, default=defaults.realtime_max_buffer_s,
                        metavar="SECONDS", help="most uncommitted input audio a realtime session may hold "
                                                "(default: %(default)s)")
    limits.add_argument("--realtime-idle-timeout", type=float, default=defaults.realtime_idle_timeout_s,
                        metavar="SECONDS", help="a realtime session silent this long, with no response running, "
                                                "is closed (default: %(default)s)")
    limits.add_argument("--no-video-chat-prefill", dest="video_chat_prefill", action="store_false",
                        help="WS /v1/video/chat/stream: prefill each query's whole prompt when it comes instead of "
                             "prefilling the frames as they arrive")
    limits.add_argument("--no-realtime-prefill", dest="realtime_prefill", action="store_false",
                        help="WS /v1/realtime: hear the user's turn as one audio clip prefilled at the commit instead "
                             "of prefilling it in clips of half a second while they speak")
    limits.add_argument("--graceful-timeout", type=float, default=30.0,
                        help="seconds in-flight requests get to finish at shutdown (default: %(default)s)")
    media = p.add_argument_group("media URLs")
    media.add_argument("--allowed-media-domains", nargs="*", default=[], metavar="HOST",
                       help="hosts whose https media URLs requests may name (image_url, input_audio, audio_url): "
                            "'example.com', '*.example.com', '*' (any public host), or 'http://HOST[:PORT]' to "
                            "allow plain http; private and loopback addresses need the literal IP (default: none, "
                            "no URL is fetched)")
    media.add_argument("--allowed-local-media-path", default=None, metavar="DIR",
                       help="folder that file:// media URLs may name (default: none)")
    security = p.add_argument_group("access")
    security.add_argument("--public-docs", action="store_true",
                          help="with --api-key, leave /openapi.json, /docs and /redoc open")
    security.add_argument("--protect-metrics", action="store_true", help="with --api-key, /metrics needs it too")
    p.add_argument("--no-restart", action="store_true",
                   help="do not restart a stage whose engine or process died (it stays down, /health 503); "
                        "the same as the deploy field max_restarts: 0 on every stage")
    p.add_argument("--stage-timeout", type=float, default=None, metavar="SECONDS",
                   help="a process or Ray stage silent this long is hung: /health 503, its requests 503, and it "
                        "is restarted; the deploy field stage_timeout_s on every stage (default: 10 times its "
                        "slowest step, at least 120 s)")
    p.add_argument("--output-dir", default=None,
                   help="where served files, video jobs and stored responses are kept; with it, finished video "
                        "jobs and stored responses survive a restart (default: a temporary folder removed at shutdown)")
    p.add_argument("--response-ttl", type=float, default=30 * 24 * 3600.0, metavar="SECONDS",
                   help="how long a stored response (/v1/responses, store: true) stays readable and continuable "
                        "(default: 30 days)")
    p.add_argument("--max-stored-responses", type=int, default=10000, metavar="N",
                   help="most stored responses kept; the oldest go first (default: 10000)")
    p.add_argument("--no-playground", dest="playground", action="store_false",
                   help="do not serve the web playground at /")
    p.add_argument("--api-server-count", type=int, default=1, metavar="N",
                   help="HTTP server processes sharing the port and one engine: encoding answers (PNG, base64, "
                        "JSON, audio) runs in them, off the engine's process; a dead one is restarted "
                        "(default: %(default)s, the engine and the server in one process)")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    p.set_defaults(func=run)


def demo_deploy_config(deploy_config: str | None, is_demo: bool) -> Any:
    """The deploy file in force: the user's, else the demo's own for the demo, else None
    (the model family's bundled file, with the checkpoint's own defaults)."""
    if deploy_config is not None or not is_demo:
        return deploy_config
    from omnistage.config.deploy import bundled_deploy_path

    return bundled_deploy_path(DEMO_DEPLOY)


def resolve_model(model: str | None) -> tuple[str, str, bool]:
    """(model path, served name, is_demo)."""
    if model:
        return model, model, False
    from omnistage.testing import ensure

    print(f"[omnistage] no model given: building the tiny demo model {DEMO_MODEL!r} (once, cached)", flush=True)
    path = ensure(DEMO_MODEL)
    return str(path), f"omnistage-demo-{DEMO_MODEL}", True


def runtime_overrides(args: argparse.Namespace) -> Any:
    """`--stage-overrides` with `--no-restart` and `--stage-timeout` added for every stage ("*")."""
    extra = {}
    if args.no_restart:
        extra["max_restarts"] = 0
    if args.stage_timeout is not None:
        extra["stage_timeout_s"] = args.stage_timeout
    if not extra:
        return args.stage_overrides
    overrides = json.loads(args.stage_overrides) if isinstance(args.stage_overrides, str) else {}
    if not isinstance(overrides, dict):
        return args.stage_overrides  # parse_stage_overrides names the problem
    return {**overrides, "*": {**overrides.get("*", {}), **extra}}


class _Terminated(Exception):
    """SIGTERM, turned into an exception so that cleanup runs and the exit code is 0."""


def _on_sigterm(signum: int, frame: Any) -> None:
    raise _Terminated()


def build(args: argparse.Namespace) -> tuple[Any, Any, bool]:
    """(engine, app, is_demo): what `omnistage serve` serves for `args`, not yet listening (the
    tests' in-process servers start the same); ValueError for a bad model, deploy file or flag."""
    from omnistage.entrypoints.openai.api_server import create_app

    engine, settings, registry, is_demo = build_engine(args)
    try:
        return engine, create_app(settings, engine, registry), is_demo
    except BaseException:
        engine.close()
        raise


def build_engine(args: argparse.Namespace) -> tuple[Any, Any, Any, bool]:
    """(engine, server settings, the engine's metrics registry, is_demo) for `args`."""
    from prometheus_client import CollectorRegistry

    from omnistage.entrypoints.omni import AsyncOmni
    from omnistage.entrypoints.openai.settings import ServerSettings

    path, name, is_demo = resolve_model(args.model)
    settings = ServerSettings(
        served_model_name=args.served_model_name or name, model_path=path, api_key=args.api_key,
        max_upload_bytes=args.max_upload_bytes, max_n=args.max_n, max_pixels=args.max_pixels,
        max_queued_requests=args.max_queued_requests, file_ttl_s=args.file_ttl,
        max_input_pixels=args.max_input_pixels, allowed_media_domains=tuple(args.allowed_media_domains),
        allowed_local_media_path=args.allowed_local_media_path, public_docs=args.public_docs,
        protect_metrics=args.protect_metrics, files_dir=args.output_dir, playground=args.playground,
        response_ttl_s=args.response_ttl, max_stored_responses=args.max_stored_responses,
        realtime_max_session_s=args.realtime_max_session, realtime_max_buffer_s=args.realtime_max_buffer,
        realtime_idle_timeout_s=args.realtime_idle_timeout, api_server_count=args.api_server_count,
        video_chat_prefill=args.video_chat_prefill, realtime_prefill=args.realtime_prefill)
    registry = CollectorRegistry()
    print(f"[omnistage] loading {path}", flush=True)
    engine = AsyncOmni(path, deploy_config=demo_deploy_config(args.deploy_config, is_demo),
                       stage_overrides=runtime_overrides(args), metrics_registry=registry)
    return engine, settings, registry, is_demo


def run(args: argparse.Namespace) -> int:
    import asyncio

    import uvicorn

    from omnistage.entrypoints.openai import api_servers
    from omnistage.entrypoints.openai.capabilities import Capabilities
    from omnistage.entrypoints.openai.draining_server import DrainingServer

    # uvicorn re-raises the signal it stopped on once it has shut down; SIGTERM's default
    # action would kill the process before the engine is closed.
    signal.signal(signal.SIGTERM, _on_sigterm)
    engine = None
    try:
        if args.api_server_count > 1:
            engine, settings, _, is_demo = build_engine(args)
            announce(args, settings, Capabilities.from_spec(settings.served_model_name, engine.spec), is_demo)
            asyncio.run(api_servers.serve(engine, settings, args.host, args.port,
                                          uvicorn_options(args), api_server_policy(args)))
        else:
            engine, app, is_demo = build(args)
            announce(args, app.state.settings, app.state.capabilities, is_demo)
            config = uvicorn.Config(app, host=args.host, port=args.port, **uvicorn_options(args))
            DrainingServer(config, app.state.gateway).run()
    except (KeyboardInterrupt, _Terminated):
        pass
    except ValueError as e:  # bad deploy config, stage overrides, model or flags
        print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        if engine is not None:
            engine.close()  # the app's lifespan has closed it unless startup failed; closing twice is a no-op
    print("[omnistage] stopped", flush=True)
    return 0


def announce(args: argparse.Namespace, settings: Any, capabilities: Any, is_demo: bool) -> None:
    url = f"http://{args.host}:{args.port}"
    processes = f" ({args.api_server_count} API server processes)" if args.api_server_count > 1 else ""
    print(f"[omnistage] serving {settings.served_model_name} at {url}{processes}", flush=True)
    if settings.playground:
        print(f"[omnistage] playground: {url}/", flush=True)
    print(f"[omnistage] routes: {', '.join(capabilities.routes)}", flush=True)
    if is_demo:
        print("[omnistage] the demo model has random weights: its images are noise.", flush=True)
    print(f"[omnistage] try: {example_curl(url, capabilities, bool(args.api_key))}", flush=True)


def uvicorn_options(args: argparse.Namespace) -> dict[str, Any]:
    return {"log_level": args.log_level, "timeout_graceful_shutdown": args.graceful_timeout}


def api_server_policy(args: argparse.Namespace) -> Any:
    """How a dead API server process is rebuilt: as a stage is (`--no-restart`: never)."""
    from omnistage.runtime.supervisor import RestartPolicy

    return RestartPolicy(max_restarts=0) if args.no_restart else RestartPolicy()


def example_curl(url: str, capabilities: Any, with_key: bool) -> str:
    """A curl command for the first route the model serves."""
    auth = ' -H "Authorization: Bearer $OMNISTAGE_API_KEY"' if with_key else ""
    if capabilities.serves("images.generations"):
        body = {"prompt": "a lighthouse at dusk", "size": "64x64", "num_inference_steps": 4}
        return (f"curl {url}/v1/images/generations{auth} -H 'Content-Type: application/json' "
                f"-d '{json.dumps(body)}' | python -c \"import sys, json, base64; "
                f"open('out.png', 'wb').write(base64.b64decode(json.load(sys.stdin)['data'][0]['b64_json']))\"")
    if capabilities.serves("images.edits"):
        return (f"curl {url}/v1/images/edits{auth} -F image=@in.png -F prompt='make it blue' "
                f"-F response_format=url")
    if capabilities.serves("videos"):
        return f"curl {url}/v1/videos/sync{auth} -F prompt='waves on a beach' -o out.mp4"
    if capabilities.serves("chat"):
        body = {"messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 32}
        return f"curl {url}/v1/chat/completions{auth} -H 'Content-Type: application/json' -d '{json.dumps(body)}'"
    if capabilities.serves("audio.speech"):
        body = {"input": "Hello there!", "response_format": "wav"}
        return (f"curl {url}/v1/audio/speech{auth} -H 'Content-Type: application/json' "
                f"-d '{json.dumps(body)}' -o out.wav")
    return f"curl {url}/v1/models{auth}"
