"""``python -m roll.agentic.env.sokoban_sandbox.app --write-app DIR`` (and ``--dockerfile``): see the package."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from roll.agentic.env.sokoban_sandbox.app import APP_FILES, DOCKERFILE, write_app


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m roll.agentic.env.sokoban_sandbox.app",
        description="The /app files of the sokoban_sandbox image: roll's Sokoban server and client.",
    )
    parser.add_argument("--write-app", metavar="DIR", help="write server.py, client.py and the modules they use")
    parser.add_argument("--dockerfile", action="store_true", help="print a Dockerfile for the folder")
    args = parser.parse_args(argv)
    if not args.write_app and not args.dockerfile:
        parser.error("give --write-app DIR and/or --dockerfile")
    if args.write_app:
        root = write_app(args.write_app)
        print(f"wrote {', '.join(APP_FILES)} into {root}", file=sys.stderr)
    if args.dockerfile:
        sys.stdout.write(DOCKERFILE)


if __name__ == "__main__":
    main()
