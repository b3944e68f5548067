"""`omnistage models [--speech] [--markdown]`: the support matrix of the native diffusion
pipelines (omnistage/diffusion/support.py), or with `--speech` the table of the families that
speak (omnistage/models/speech_support.py), read from the families' declarations."""

from __future__ import annotations

import argparse


def register(subparsers) -> None:
    p = subparsers.add_parser("models", help="which model families take which modalities and accelerations")
    p.add_argument("--speech", action="store_true",
                   help="the families that speak: their voices, streaming and batch routes")
    p.add_argument("--markdown", action="store_true", help="print a Markdown table (as in the docs)")
    p.set_defaults(func=_show)


def _show(args: argparse.Namespace) -> int:
    if args.speech:
        from omnistage.models import speech_support as support
    else:
        from omnistage.diffusion import support

    rows = support.rows()
    print(support.markdown(rows) if args.markdown else support.text(rows))
    return 0
