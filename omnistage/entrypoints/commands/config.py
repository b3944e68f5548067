"""`omnistage config show MODEL [--deploy-config F] [--stage-overrides JSON] [--platform P]`.

Prints the resolved pipeline and the merged, effective deploy config as YAML: what
`omnistage serve` would start with the same arguments.
"""

from __future__ import annotations

import argparse
import sys


def register(subparsers) -> None:
    p = subparsers.add_parser("config", help="inspect pipeline resolution and deploy configs")
    sub = p.add_subparsers(dest="config_command", metavar="CONFIG_COMMAND", required=True)
    show = sub.add_parser("show", help="print the resolved pipeline and the effective deploy config")
    show.add_argument("model", help="local model folder or Hugging Face hub id")
    show.add_argument("--deploy-config", default=None, help="deploy YAML file (default: the family's bundled one)")
    show.add_argument(
        "--stage-overrides",
        default=None,
        help='JSON object of per-stage fields by stage id or "*", e.g. \'{"0": {"max_num_seqs": 4}}\'',
    )
    show.add_argument("--platform", default=None, help="platform overlay to apply (default: detected)")
    show.set_defaults(func=_show)


def _show(args: argparse.Namespace) -> int:
    import yaml

    from omnistage.config import resolve_config

    try:
        config = resolve_config(
            args.model,
            args.deploy_config,
            stage_overrides=args.stage_overrides,
            platform=args.platform,
        )
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(yaml.safe_dump(config.to_dict(), sort_keys=False, default_flow_style=False), end="")
    return 0
