"""Reading HF checkpoints tensor by tensor, and writing HF folders (pure: safetensors + transformers).

Each Megatron rank reads only the tensors its shard needs (safetensors memory-maps files), so loading a model
never materializes the whole HF state dict on every rank.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from roll.strategies.contract import StrategyError

__all__ = ["HfCheckpointReader", "write_hf_folder"]

logger = logging.getLogger(__name__)

_INDEX = "model.safetensors.index.json"


class HfCheckpointReader:
    """Lazy access to the tensors of an HF model folder (``*.safetensors``, sharded or not; or ``*.bin``)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._files: dict[str, Path] = {}
        self._handles: dict[Path, Any] = {}
        self._bin_state: dict[str, torch.Tensor] | None = None
        index = self.path / _INDEX
        if index.exists():
            weight_map = json.loads(index.read_text())["weight_map"]
            self._files = {name: self.path / file for name, file in weight_map.items()}
        elif files := sorted(self.path.glob("*.safetensors")):
            from safetensors import safe_open

            for file in files:
                with safe_open(str(file), framework="pt") as handle:
                    self._files.update(dict.fromkeys(handle.keys(), file))
        elif bins := sorted(self.path.glob("pytorch_model*.bin")):
            self._bin_state = {}
            for file in bins:
                self._bin_state.update(torch.load(file, map_location="cpu", weights_only=True, mmap=True))
        else:
            raise StrategyError(f"{self.path} has no *.safetensors or pytorch_model*.bin weights")

    @property
    def names(self) -> list[str]:
        return sorted(self._bin_state if self._bin_state is not None else self._files)

    def __contains__(self, name: object) -> bool:
        return name in (self._bin_state if self._bin_state is not None else self._files)

    def get(self, name: str) -> torch.Tensor:
        """One tensor (CPU). Raises StrategyError naming the folder if it is missing."""
        if self._bin_state is not None:
            if name not in self._bin_state:
                raise StrategyError(f"{self.path} has no tensor {name!r}")
            return self._bin_state[name]
        file = self._files.get(name)
        if file is None:
            raise StrategyError(f"{self.path} has no tensor {name!r}")
        handle = self._handles.get(file)
        if handle is None:
            from safetensors import safe_open

            handle = self._handles[file] = safe_open(str(file), framework="pt")
        return handle.get_tensor(name)

    def close(self) -> None:
        self._handles.clear()
        self._bin_state = None


def _save_shards(named_tensors: Iterable[tuple[str, torch.Tensor]], path: Path, max_shard_bytes: int) -> int:
    """Write ``model-XXXXX.safetensors`` shards (renamed at the end) plus an index if there is more than one."""
    from safetensors.torch import save_file

    shards: list[list[str]] = []
    current: dict[str, torch.Tensor] = {}
    size = total = 0

    def flush() -> None:
        nonlocal current, size
        if current:
            save_file(current, str(path / f"shard-{len(shards):05d}.tmp"), metadata={"format": "pt"})
            shards.append(list(current))
            current, size = {}, 0

    for name, tensor in named_tensors:
        nbytes = tensor.numel() * tensor.element_size()
        if current and size + nbytes > max_shard_bytes:
            flush()
        # One private CPU copy per tensor: safetensors refuses tensors that share storage (views, tied weights).
        current[name] = tensor.detach().to("cpu", copy=True).contiguous()
        size += nbytes
        total += nbytes
    flush()
    if len(shards) == 1:
        (path / "shard-00000.tmp").rename(path / "model.safetensors")
        return total
    weight_map = {}
    for i, names in enumerate(shards):
        file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        (path / f"shard-{i:05d}.tmp").rename(path / file)
        weight_map.update(dict.fromkeys(names, file))
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (path / _INDEX).write_text(json.dumps(index, indent=2, sort_keys=True))
    return total


def write_hf_folder(
    path: str | Path,
    named_tensors: Iterable[tuple[str, torch.Tensor]],
    hf_config: Any,
    *,
    tokenizer: Any = None,
    generation_config: Any = None,
    max_shard_bytes: int = 5 * 1024**3,
) -> None:
    """Save tensors (HF names) with the model's config, tokenizer and generation config as an HF folder."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    for stale in [*path.glob("*.safetensors"), *path.glob(_INDEX)]:
        stale.unlink()  # a previous export with more shards must not leave files behind
    dtype = None

    def tracked() -> Iterable[tuple[str, torch.Tensor]]:
        nonlocal dtype
        for name, tensor in named_tensors:
            dtype = dtype or tensor.dtype
            yield name, tensor

    total = _save_shards(tracked(), path, max_shard_bytes)
    if dtype is not None:
        # transformers >= 4.56 calls it ``dtype``; older versions ``torch_dtype``.
        setattr(hf_config, "dtype" if hasattr(hf_config, "dtype") else "torch_dtype", dtype)
    hf_config.save_pretrained(str(path))
    if tokenizer is not None:
        tokenizer.save_pretrained(str(path))
    if generation_config is not None:
        generation_config.save_pretrained(str(path))
    logger.info("exported %.1f MB of weights to %s", total / 1e6, path)
