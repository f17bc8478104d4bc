"""The client of roll's Sokoban game server, as the ``sokoban_sandbox`` env calls it (standard library only)::

    python client.py reset [--seed N] [--json]
    python client.py action '<answer>Up</answer>' [--json]

talks to the server on ``127.0.0.1:$SOKOBAN_PORT`` (8001 unless set; ``--port`` overrides). With ``--json`` it prints
the server's answer as one JSON line (``observation``, ``reward``, ``terminated``, ``truncated``, ``info``), else the
observation and the map. A server that does not answer, or refuses the call, is a message on stderr and exit code 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

DEFAULT_PORT = 8001


def call(port: int, path: str, body: dict[str, Any], timeout: float = 30.0) -> dict[str, Any]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    # no proxy: the server is on this machine
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(request, timeout=timeout) as response:
        answer = json.loads(response.read())
    if not isinstance(answer, dict):
        raise ValueError(f"the server answered {answer!r}")
    return answer


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Play roll's Sokoban game server.")
    parser.add_argument("--port", type=int, default=int(os.environ.get("SOKOBAN_PORT", DEFAULT_PORT)))
    commands = parser.add_subparsers(dest="command", required=True)
    reset = commands.add_parser("reset", help="start a new game")
    reset.add_argument("--seed", type=int, default=None)
    reset.add_argument("--json", action="store_true", help="print the answer as JSON")
    action = commands.add_parser("action", help="play one move (the model's reply)")
    action.add_argument("text")
    action.add_argument("--json", action="store_true", help="print the answer as JSON")
    args = parser.parse_args(argv)
    path, body = ("/reset", {"seed": args.seed}) if args.command == "reset" else ("/step", {"action": args.text})
    try:
        answer = call(args.port, path, body)
    except urllib.error.HTTPError as e:
        print(f"error: the server refused {path}: {e.code} {e.read().decode(errors='replace')}", file=sys.stderr)
        return 1
    except (OSError, ValueError) as e:
        print(f"error: no answer from the game server on port {args.port}: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(answer))
    else:
        print(answer.get("observation", ""))
        print((answer.get("info") or {}).get("suffix", ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
