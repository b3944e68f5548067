"""`omnistage zoo list` and `omnistage zoo build NAME DIR [--size tiny|small] [--seed N]`."""

from __future__ import annotations

import argparse
import sys


def register(subparsers) -> None:
    p = subparsers.add_parser("zoo", help="tiny random-weight models in real on-disk formats")
    sub = p.add_subparsers(dest="zoo_command", metavar="ZOO_COMMAND", required=True)
    ls = sub.add_parser("list", help="list the zoo models")
    ls.set_defaults(func=_list)
    b = sub.add_parser("build", help="write a zoo model into DIR")
    b.add_argument("name")
    b.add_argument("dir")
    b.add_argument("--size", default="tiny", choices=["tiny", "small"])
    b.add_argument("--seed", type=int, default=0)
    b.set_defaults(func=_build)


def _list(args: argparse.Namespace) -> int:
    from omnistage.testing import list_models

    for m in list_models():
        print(f"{m.name:18s} {m.kind:10s} sizes={','.join(m.sizes):11s} {m.reference_class}")
    return 0


def _build(args: argparse.Namespace) -> int:
    from omnistage.testing import build

    try:
        out = build(args.name, args.dir, size=args.size, seed=args.seed)
    except (KeyError, ValueError, FileExistsError) as e:
        print(f"error: {e.args[0] if e.args else e}", file=sys.stderr)
        return 2
    print(out)
    return 0
