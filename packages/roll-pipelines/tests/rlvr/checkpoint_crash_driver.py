"""A driver for the checkpoint crash test: runs rlvr-tiny and stalls inside the save of one checkpoint.

``python checkpoint_crash_driver.py '<overrides json>' <step> <marker>``: when checkpoint ``step`` is being saved
(the roles' files are written, the pipeline state and manifest are not, nothing is renamed) it writes its pid to
``marker`` and sleeps, so the test can SIGKILL it there.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from roll.pipelines.checkpoint import CheckpointManager, PipelineState
from roll.pipelines.config import load_config
from roll.pipelines.launcher import run_config


def main() -> None:
    overrides, kill_step, marker = json.loads(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
    original = CheckpointManager.commit

    def stalling_commit(self: CheckpointManager, step: int, state: PipelineState) -> Any:
        if step == kill_step:
            marker.write_text(str(os.getpid()))
            time.sleep(3600)
        return original(self, step, state)

    CheckpointManager.commit = stalling_commit  # type: ignore[method-assign]
    run_config(load_config("rlvr-tiny", overrides))


if __name__ == "__main__":
    main()
