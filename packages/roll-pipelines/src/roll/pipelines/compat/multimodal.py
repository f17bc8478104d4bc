"""ROLL configs for its multimodal pipelines (images, video, audio): recognised by what they use, refused in one line.

ROLL launches these with its VL scripts (start_rlvr_vl_pipeline.py, start_distill_vl_pipeline.py) or plays
image-observation envs (VLTrajEnvManager). roll has no multimodal pipeline, so such a file gets one clear reason
naming what marks it as multimodal, instead of a list of the keys that follow from it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

__all__ = ["multimodal_markers"]

_FOLDERS = {"image_folder": "image", "video_folder": "video", "audio_folder": "audio"}
_VL_TEMPLATES = {"qwen2-vl", "qwen2_vl", "qwen2_5_vl", "qwen2.5-vl", "qwen3-vl", "qwen3_vl"}
_CLASSES = {
    "DetectionRewardWorker": "ROLL's image-detection reward",
    "VideoR1RewardWorker": "ROLL's video reward",
    "VLTrajEnvManager": "ROLL's image-observation env manager",
}


def _walk(node: Any, path: str) -> Iterator[tuple[str, str, Any]]:
    if isinstance(node, dict):
        for key, value in node.items():
            where = f"{path}.{key}" if path else str(key)
            yield where, str(key), value
            yield from _walk(value, where)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _walk(value, f"{path}[{i}]")


def multimodal_markers(data: dict[str, Any]) -> list[str]:
    """What in a composed ROLL config marks it as multimodal (empty: a text-only config)."""
    found: list[str] = []
    for where, key, value in _walk(data, ""):
        if key in _FOLDERS and value:
            found.append(f"{where} ({_FOLDERS[key]} data)")
        elif key == "template" and isinstance(value, str) and value.lower() in _VL_TEMPLATES:
            found.append(f"{where}: {value} (a vision-language chat template)")
        elif key == "custom_data_kwargs_func" and "vlm_dataset_utils" in str(value):
            found.append(f"{where}: {value} (multimodal features)")
        elif key in ("worker_cls", "env_manager_cls") and isinstance(value, str):
            name = value.rsplit(".", 1)[-1]
            if name in _CLASSES:
                found.append(f"{where}: {_CLASSES[name]}")
    return found
