"""``python3 -m tools.infra up|down|status|env|destroy|promtool`` (see the package docstring)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from tools.infra.promtool import ensure_promtool
from tools.infra.stack import destroy, down, status, up
from tools.infra.state import BASE_ENV_VAR, DEFAULT_BASE, env_file, resolve_base
from tools.infra.system import InfraError


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.infra",
        description="Local RabbitMQ + PostgreSQL for development, tests and CI.",
    )
    parser.add_argument(
        "--base",
        type=Path,
        default=None,
        help=f"state folder (default: ${BASE_ENV_VAR} or {DEFAULT_BASE})",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("up", help="install if missing, start both, write and print <base>/env")
    commands.add_parser("down", help="stop both (data stays)")
    commands.add_parser("status", help="print whether each runs (exit 3 unless both run)")
    commands.add_parser("env", help="print <base>/env")
    commands.add_parser("destroy", help="stop both and delete all their data")
    promtool = commands.add_parser("promtool", help="run Debian's promtool (unpacked under <base> on first use)")
    promtool.add_argument("args", nargs=argparse.REMAINDER, help="promtool's own arguments")
    # promtool's own options (``--version``) are passed on, not taken for ours.
    args, extra = parser.parse_known_args(argv)
    if extra and args.command != "promtool":
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    base = resolve_base(args.base)
    try:
        if args.command == "up":
            for key, value in up(base).items():
                print(f"{key}={value}")
        elif args.command == "down":
            down(base)
        elif args.command == "status":
            return 0 if all(status(base).values()) else 3
        elif args.command == "env":
            env = env_file(base)
            if not env.exists():
                print(f"no {env}: run `python -m tools.infra up` first", file=sys.stderr)
                return 1
            sys.stdout.write(env.read_text())
        elif args.command == "destroy":
            destroy(base)
        elif args.command == "promtool":
            binary = ensure_promtool(base)
            os.execv(binary, [str(binary), *args.args, *extra])
    except InfraError as exc:
        print(f"[infra] error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
