"""tools/diagnostics/frozenlake_perception --checkpoint reads the model weights out of an fsdp2 ``actor_train``
checkpoint folder (a distributed checkpoint holding ``model`` and ``optimizer``) as they were saved."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp

from tools.diagnostics.cloning import tiny_model
from tools.diagnostics.frozenlake_perception import checkpoint_weights


def test_checkpoint_weights_are_the_saved_model_weights(tmp_path: Path):
    _, model = tiny_model("nano", 3)
    saved = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    dcp.save(
        {"model": saved, "optimizer": optimizer.state_dict()}, checkpoint_id=tmp_path / "actor_train" / "model_optim"
    )

    loaded = checkpoint_weights(tmp_path / "actor_train")

    assert loaded.keys() == saved.keys()
    assert all(torch.equal(loaded[name], saved[name]) for name in saved)
    _, fresh = tiny_model("nano", 4)  # other initial weights: loading must replace every one of them
    fresh.load_state_dict(loaded)
    assert all(torch.equal(fresh.state_dict()[name], saved[name]) for name in saved)
