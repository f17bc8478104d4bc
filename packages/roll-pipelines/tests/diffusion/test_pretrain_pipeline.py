"""The ``diffusion_pretrain`` pipeline (Ray, one fsdp2_train worker) trains exactly the teacher of the in-process
reference ``pretrain_teacher``: same draws, same AdamW / clip / EMA order, one thread, so the results measured with
that teacher hold for the recipe's. A few steps; the recipe itself runs 2000."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from roll.pipelines.config import load_config
from roll.pipelines.diffusion.teacher import PretrainSettings, pretrain_teacher
from roll.pipelines.launcher import run_config
from roll.pipelines.tracking import read_metrics
from roll.runtime.testing import local_ray

pytestmark = [pytest.mark.integration, pytest.mark.extra("diffusers")]

STEPS = 20


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(folder / "diffusion_pytorch_model.safetensors"))


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory):
    """(pipeline output folder, in-process reference folder) after STEPS steps each."""
    root = tmp_path_factory.mktemp("pretrain")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the recipe's worker runs one torch thread
    try:
        reference = pretrain_teacher(PretrainSettings(steps=STEPS), root / "reference", log_every=0)
    finally:
        torch.set_num_threads(threads)
    out = root / "run"
    overrides = {
        "output_dir": out,
        "max_steps": STEPS,
        "eval_steps": 10,
        "logging_steps": 10,
        "save_steps": 10,
        "export_hf": "true",
        "plots": "true",
        "evaluation.num_samples": 16,
        "pretrain.sample_steps": 4,
    }
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ROLL_CACHE_DIR", str(root / "cache"))
        with local_ray(num_cpus=8):
            run_config(load_config("diffusion-pretrain-tiny", [f"{k}={v}" for k, v in overrides.items()]))
    return out, reference


def test_pipeline_teacher_equals_the_in_process_reference(runs):
    out, reference = runs
    mine, theirs = _weights(out / "hf_export"), _weights(reference)
    assert mine.keys() == theirs.keys()
    worst = max(float((mine[k] - theirs[k]).abs().max()) for k in mine)
    assert worst == 0.0, f"largest weight difference {worst}"
    assert (out / "hf_export" / "scheduler" / "scheduler_config.json").is_file()


def test_pipeline_evaluates_the_ema_and_writes_grids_and_checkpoints(runs):
    out, reference = runs
    rows = [row for row in read_metrics(out / "metrics.jsonl") if "val/denoising_loss" in row]
    assert [row["step"] for row in rows] == [0, 10, 20]
    recorded = json.loads((reference / "roll_pretrain.json").read_text())["heldout_denoising_loss"]
    assert rows[-1]["val/denoising_loss"] == pytest.approx(recorded, rel=1e-5)
    assert rows[-1]["val/denoising_loss"] < rows[0]["val/denoising_loss"]
    assert all(row["val/fd"] > 0 for row in rows)
    train = [row for row in read_metrics(out / "metrics.jsonl") if "train/loss" in row]
    assert [row["step"] for row in train] == [10, 20] and all(row["time/steps_total_s"] > 0 for row in train)
    assert (out / "plots" / "samples_4step_step0020.png").is_file()
    assert (out / "checkpoints").is_dir() and list((out / "checkpoints").glob("*/denoiser/ema/rank_0.pt"))
