"""The ``roll`` command.

roll run CONFIG_OR_RECIPE [field.path=value ...]    run a pipeline
roll validate CONFIG_OR_RECIPE [field.path=value]   check a config without starting workers
roll convert ROLL.yaml [-o OUT.yaml]                 ROLL config -> roll YAML, with what became of every key
roll recipes                                        list built-in recipes
roll --version                                      the versions of roll's packages

ROLL's own YAML files (Hydra ``defaults``, ``${...}``, flat PPO keys) are accepted by run, validate and convert.
Only argparse is imported before the arguments are parsed, and ``--help``, ``--version`` and ``recipes`` import no
torch, Ray or transformers: they answer at once.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from roll.runtime import RollError

__all__ = ["main"]

EXIT_CONFIG = 2  # a config, data or environment problem the user fixes (ConfigError.exit_code)
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143  # 128 + SIGTERM, what a shell reports for a process the signal ended
_PACKAGES = ("roll-protocol", "roll-runtime", "roll-strategies", "roll-pipelines", "roll-agentic")


def _versions() -> str:
    """``roll-pipelines 0.1.0`` and the other installed roll packages (from their metadata: nothing is imported)."""
    from importlib.metadata import PackageNotFoundError, version

    from roll.pipelines import __version__

    parts = [f"roll-pipelines {__version__}"]
    for name in _PACKAGES:
        if name != "roll-pipelines":
            try:
                parts.append(f"{name} {version(name)}")
            except PackageNotFoundError:
                continue
    return ", ".join(parts)


def _cmd_recipes(args: argparse.Namespace) -> int:
    import shutil
    import textwrap

    from roll.pipelines.recipes import list_recipes

    recipes = list_recipes()
    width = max(map(len, recipes), default=0)
    # Descriptions wrap under their own column, so a long one does not run into the next recipe's name.
    text_width = max(shutil.get_terminal_size((100, 24)).columns - width - 2, 40)
    for name, description in recipes.items():
        lines = textwrap.wrap(description, text_width, break_on_hyphens=False) or [""]
        print(f"{name:<{width}}  {lines[0]}")
        for line in lines[1:]:
            print(f"{'':<{width}}  {line}")
    return 0


def _announce_roll_format(path: str, overrides: list[str]) -> None:
    """Say which pipeline a ROLL config (no pipeline_cls) was taken as."""
    from roll.pipelines.config import read_config_source

    if not (path.endswith((".yaml", ".yml"))):
        return
    _, _, translation = read_config_source(path, overrides)
    if translation is not None:
        print(
            f"{path}: ROLL config, run as pipeline {translation.pipeline} ({translation.reason}); "
            f"`roll convert {path}` shows every key"
        )


def _cmd_convert(args: argparse.Namespace) -> int:
    import yaml

    from roll.pipelines.compat import format_report
    from roll.pipelines.config import read_config_source, with_roll_overrides
    from roll.runtime import ConfigError

    data, label, translation = read_config_source(args.config, args.overrides)
    if translation is None:
        print(f"{label} names pipeline_cls, so it is already a roll config; nothing to convert")
        return 0
    try:  # the overrides of roll's own fields too, so the output is what `roll run` would load
        data = with_roll_overrides(data, args.overrides, translation)
    except ValueError as e:
        raise ConfigError(f"{label}: {e}") from None
    text = yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
    header = (
        f"# converted from {label} (ROLL) by `roll convert`: pipeline {translation.pipeline} ({translation.reason})\n"
    )
    if args.output:
        with open(args.output, "w") as f:
            f.write(header + text)
        print(f"wrote {args.output}")
    else:
        print(header + text)
    print(format_report(translation), file=sys.stderr if not args.output else sys.stdout)
    problems = translation.problems
    if problems:
        print(f"error: {len(problems)} key(s) roll cannot honour (status unsupported/unknown above)", file=sys.stderr)
        return EXIT_CONFIG
    return 0


def _cmd_validate(args: argparse.Namespace) -> int:
    from roll.pipelines.config import load_config
    from roll.pipelines.validate import validate_deployment

    _announce_roll_format(args.config, args.overrides)
    config = load_config(args.config, args.overrides)
    for line in validate_deployment(config, check_ray=not args.no_ray):
        print(line)
    print(f"OK: {args.config} is a valid {config.pipeline_cls} config")
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    from roll.pipelines.config import load_config
    from roll.pipelines.launcher import TRAINED_RECIPES, run_config
    from roll.pipelines.summary import summarize_run
    from roll.pipelines.validate import package_warnings

    started = time.perf_counter()
    _announce_roll_format(args.config, args.overrides)
    config = load_config(args.config, args.overrides)
    for line in package_warnings(config):
        print(line, file=sys.stderr)
    run_config(config)
    notes = [
        f"(of which training the cached recipe {name}: {seconds / 60:.1f} min)" for name, seconds in TRAINED_RECIPES
    ]
    # Wall times on a shared machine mean little without its load.
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    notes.append(f"machine: {os.cpu_count()} CPUs, load average {load} (1, 5, 15 min)")
    table = summarize_run(config.resolved_output_dir, wall_s=time.perf_counter() - started, notes=notes)
    if table:
        print(f"\n{config.exp_name}: held-out before/after\n{table}\n")
    if config.checkpoint_dir is None:
        print(f"done: outputs in {config.resolved_output_dir} (metrics.jsonl, plots/, checkpoints/)")
    else:
        print(
            f"done: outputs in {config.resolved_output_dir} (metrics.jsonl, plots/), checkpoints in "
            f"{config.resolved_checkpoint_dir}"
        )
    return 0


class _VersionAction(argparse.Action):
    """``--version``, its text computed only when asked for."""

    def __init__(self, option_strings: list[str], dest: str, help: str | None = None) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        print(f"{parser.prog}: {_versions()}")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="roll",
        description="Post-training LLMs on Ray: SFT, DPO, RLVR, distillation, agentic multi-turn RL, diffusion.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="Debug logging.")
    parser.add_argument("-V", "--version", action=_VersionAction, help="Show the roll packages' versions and exit.")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="Run a pipeline from a YAML config or a built-in recipe.")
    run.add_argument("config", help="Path to a YAML file, or a recipe name (see `roll recipes`).")
    run.add_argument("overrides", nargs="*", help="field.path=value overrides, e.g. max_steps=50.")
    run.set_defaults(handler=_cmd_run)
    validate = sub.add_parser("validate", help="Check a config, its paths and device mapping; start nothing.")
    validate.add_argument("config")
    validate.add_argument("overrides", nargs="*")
    validate.add_argument("--no-ray", action="store_true", help="Skip checks against the Ray cluster.")
    validate.set_defaults(handler=_cmd_validate)
    convert = sub.add_parser("convert", help="Translate a ROLL config into roll's YAML, reporting every key.")
    convert.add_argument("config")
    convert.add_argument("overrides", nargs="*", help="e.g. pipeline_cls=rlvr to override the inferred pipeline.")
    convert.add_argument("-o", "--output", help="Write the roll YAML here (default: stdout; the report to stderr).")
    convert.set_defaults(handler=_cmd_convert)
    recipes = sub.add_parser("recipes", help="List built-in recipes.")
    recipes.set_defaults(handler=_cmd_recipes)
    return parser


#: Third-party loggers that log every request at INFO: warnings only, unless ``--verbose``.
QUIET_LOGGERS = ("httpx", "httpx2")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if not args.verbose:  # a line per HTTP request (MCP sessions, search tools) would drown the run's own lines
        for chatty in QUIET_LOGGERS:
            logging.getLogger(chatty).setLevel(logging.WARNING)
    try:
        return args.handler(args)
    except KeyboardInterrupt as e:
        base = sys.modules.get("roll.pipelines.base")  # only a started pipeline turns SIGTERM into Terminated
        if base is not None and isinstance(e, base.Terminated):
            print(f"\n{e}: workers stopped; the last checkpoint (if any) is intact", file=sys.stderr)
            return EXIT_TERMINATED
        print("\ninterrupted: workers stopped; the last checkpoint (if any) is intact", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as e:
        from roll.protocol.errors import RollError

        if not isinstance(e, RollError):
            raise
        message, code = describe_error(e, verbose=args.verbose)
        print(f"error: {message}", file=sys.stderr)
        return code


def describe_error(error: RollError, verbose: bool = False) -> tuple[str, int]:
    """What the console shows for an error that ended a command, and the exit code its type gives.

    A worker that raised a roll error on purpose (a missing extra, a bad config value) is reported with that error's
    own message and exit code; its remote traceback is noise to a user and is shown only with ``--verbose``.
    """
    from roll.protocol.errors import RollError
    from roll.runtime import WorkerError

    if isinstance(error, WorkerError) and isinstance(error.cause, RollError):
        message = error.summary + (f"\nworker traceback:\n{error.remote_traceback}" if verbose else "")
        return message, error.cause.exit_code
    return str(error), error.exit_code


if __name__ == "__main__":
    sys.exit(main())
