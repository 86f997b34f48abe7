"""The `pyfront` command line."""

from __future__ import annotations

import argparse
import sys
from importlib.metadata import version


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pyfront", description="OpenAI-compatible front end for vLLM")
    parser.add_argument("--version", action="version", version=f"pyfront {version('pyfront')}")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("serve", help="run the OpenAI-compatible server (not built yet)")
    args = parser.parse_args(argv)
    if args.command == "serve":
        print("pyfront serve is not available yet: the HTTP server has not landed.", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
