"""`omnistage` console script: one subcommand per module in entrypoints/commands/.

Each command module exposes `register(subparsers)`, which adds its parser and sets
`func` to a callable taking the parsed args and returning an exit code.
"""

from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS = ("serve", "generate", "zoo", "config", "models", "bench")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="omnistage", description="Serve omni-modality models.")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"omnistage.entrypoints.commands.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"omnistage.entrypoints.commands.{name}":
                raise
            continue  # command not built yet
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
