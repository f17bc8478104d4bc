"""The rollout side of the agentic pipelines: policy clients over ``actor_infer``, train/val schedulers, writers.

Each scheduler gets its own client: a client's request queue lives on the event loop of the scheduler that uses
it. ``env_workers: ray`` hosts the client in one PolicyServer actor, so every EnvironmentWorker's requests share
one queue and the policy version stamped on results is raised in one place after each weight sync.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from roll.agentic.config import CustomEnvConfig, EnvManagerConfig
from roll.agentic.policy import (
    ClusterPolicyClient,
    GatedPolicyClient,
    PauseTimeoutError,
    RemotePolicyClient,
    serve_policy,
)
from roll.agentic.scheduler import RolloutBatch, RolloutScheduler
from roll.runtime import Cluster, ResourceManager
from roll.strategies import GenerationConfig

__all__ = ["PolicyEndpoint", "make_scheduler", "write_rollout"]

_SERVER_ANSWER_S = 60.0
"""How long past its own pause timeout the policy server may take to answer (it only has to return a count)."""
PAUSE_TIMEOUT_FIELD = "actor_infer.rpc_timeout_s"


class PolicyEndpoint:
    """A PolicyClient for one scheduler over the ``actor_infer`` cluster, local or served by a Ray actor.

    ``gated``: behind a :class:`GatedPolicyClient`, so that generation can be paused for a weight sync (async
    rollouts). ``pause_timeout_s`` bounds that pause (None: no limit); the pipeline passes ``actor_infer``'s
    ``rpc_timeout_s``, the time one of its generate calls may take: a request running longer is in a hung engine
    call (whose own timeout fails it and the rollouts with it)."""

    def __init__(
        self,
        cluster: Cluster,
        pad_token_id: int,
        *,
        remote: bool,
        gated: bool = False,
        pause_timeout_s: float | None = None,
    ) -> None:
        client: Any = ClusterPolicyClient(cluster, pad_token_id=pad_token_id)
        if gated:
            client = GatedPolicyClient(client)
        self.gated = gated
        self.pause_timeout_s = pause_timeout_s
        self.server = serve_policy(client) if remote else None
        self.client: Any = RemotePolicyClient(self.server) if self.server is not None else client

    def pause(self) -> None:
        """Stop new generation requests and wait for the running ones (gated endpoints); raise
        :class:`PauseTimeoutError` when some are still running after ``pause_timeout_s``."""
        timeout = self.pause_timeout_s
        hint = (
            ""
            if timeout is None
            else f"{PAUSE_TIMEOUT_FIELD}={timeout:g} bounds this wait, as it bounds every actor_infer call: raise it "
            "if generation is legitimately that slow"
        )
        if self.server is None:
            self.client.pause_blocking(timeout, hint)
            return
        import ray

        answer = None if timeout is None else timeout + _SERVER_ANSWER_S
        try:
            running = ray.get(self.server.pause.remote(timeout), timeout=answer)
        except ray.exceptions.GetTimeoutError:
            raise PauseTimeoutError(None, answer or 0.0, hint) from None
        if running:
            raise PauseTimeoutError(running, timeout or 0.0, hint)

    def resume(self) -> None:
        if self.server is not None:
            import ray

            ray.get(self.server.resume.remote())
        else:
            self.client.resume()

    def set_policy_version(self, version: int) -> None:
        if self.server is not None:
            import ray

            ray.get(self.server.set_policy_version.remote(version))
        else:
            self.client.set_policy_version(version)

    def close(self) -> None:
        if self.server is not None:
            import ray

            ray.kill(self.server)
            self.server = None


def make_scheduler(
    manager: EnvManagerConfig,
    custom_envs: dict[str, CustomEnvConfig],
    tokenizer: Any,
    client: Any,
    *,
    generation_config: GenerationConfig,
    sequence_length: int,
    mode: str,
    seed: int,
    resources: ResourceManager | None,
) -> RolloutScheduler:
    """A scheduler on EnvironmentWorker actors (``resources`` given) or in this process."""
    kwargs: dict[str, Any] = {
        "generation_config": manager.turn_generation(generation_config),
        "sequence_length": sequence_length,
        "mode": mode,
        "seed": seed,
    }
    if resources is None:
        return RolloutScheduler.local(manager, custom_envs, tokenizer, client, **kwargs)
    return RolloutScheduler.on_ray(manager, custom_envs, tokenizer, client, resource_manager=resources, **kwargs)


def _plain(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def write_rollout(folder: Path, name: str, rollout: RolloutBatch, tokenizer: Any) -> None:
    """``{name}.jsonl`` (one line per sample row, text decoded) and ``{name}-episodes.jsonl`` (every episode
    played, dropped and faulted ones included, with why it ended)."""
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / f"{name}-episodes.jsonl").open("w") as sink:
        for episode in rollout.episodes:
            task = episode.task
            row = {
                "traj_id": task.traj_id,
                "traj_group_id": task.traj_group_id,
                "tag": task.tag,
                "seed": task.seed,
                "end_reason": episode.end_reason,
                "success": episode.success,
                "episode_score": episode.episode_score,
                "num_turns": episode.num_turns,
                "format": episode.format_ratio,
                "kept": episode.batch is not None,
                "error": episode.error,
            }
            sink.write(json.dumps(row) + "\n")
    batch = rollout.batch
    if batch is None:
        # no rows this time: a file of this name left by an interrupted earlier run must not pass for them
        (folder / f"{name}.jsonl").unlink(missing_ok=True)
        return
    columns = batch.non_tensor_batch
    keys = [
        k
        for k in ("traj_id", "tag", "step", "state_hash", "step_scores", "episode_scores", "end_reason")
        if k in columns
    ]
    with (folder / f"{name}.jsonl").open("w") as sink:
        for i in range(len(batch)):
            prompt = batch.batch["prompts"][i][
                batch.batch["attention_mask"][i, : batch.batch["prompts"].shape[1]].bool()
            ]
            width = int(batch.batch["attention_mask"][i, batch.batch["prompts"].shape[1] :].sum())
            response = batch.batch["responses"][i][:width]
            row = {key: _plain(columns[key][i]) for key in keys}
            row.update(
                prompt=tokenizer.decode(prompt.tolist(), skip_special_tokens=False),
                response=tokenizer.decode(response.tolist(), skip_special_tokens=False),
                score=float(batch.batch["scores"][i]),
            )
            sink.write(json.dumps(row, default=str) + "\n")
