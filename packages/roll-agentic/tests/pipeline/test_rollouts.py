"""``rollout.dump`` files: one row per sample and every episode; a step without samples leaves no rows file. The
policy endpoint's pause for a weight sync is bounded, locally and through the policy server."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path

import pytest
import ray

from roll.agentic.config import CustomEnvConfig, EnvManagerConfig
from roll.agentic.pipeline.rollouts import PolicyEndpoint, write_rollout
from roll.agentic.policy import GenerateRequest, MockPolicyClient, PauseTimeoutError, ScriptedPolicy
from roll.agentic.scheduler import RolloutBatch, RolloutScheduler
from roll.runtime.testing import ship_module_by_value
from roll.strategies import GenerationConfig


def test_a_step_without_samples_leaves_no_rows_of_an_earlier_run(tokenizer, tmp_path: Path) -> None:
    """A resumed run (or a rerun in the same output_dir) whose step kept no group wrote that step's episodes but
    left the interrupted run's ``step-N.jsonl`` beside them, rows that this run never trained on."""
    config = EnvManagerConfig(num_env_groups=2, group_size=2, tags=["Lake"])
    client = MockPolicyClient(tokenizer, ScriptedPolicy(lambda prompt: "<answer>Up</answer>"))
    scheduler = RolloutScheduler.local(
        config,
        {"Lake": CustomEnvConfig(env_type="frozen_lake", max_steps=2)},
        tokenizer,
        client,
        generation_config=GenerationConfig(max_new_tokens=16),
        sequence_length=1024,
    )
    try:
        out = scheduler.get_batch(4)
    finally:
        scheduler.close()
    write_rollout(tmp_path, "step-000003", out, tokenizer)  # the interrupted run's step 3
    rows = [json.loads(line) for line in (tmp_path / "step-000003.jsonl").open()]
    assert len(rows) == 4 and all(row["prompt"] and row["response"] for row in rows)

    write_rollout(tmp_path, "step-000003", RolloutBatch(None, out.episodes), tokenizer)  # the resumed run's
    assert not (tmp_path / "step-000003.jsonl").exists()
    episodes = [json.loads(line) for line in (tmp_path / "step-000003-episodes.jsonl").open()]
    assert len(episodes) == 4


class _HungEngine:
    """An ``actor_infer`` whose generate call never answers (an engine hung mid-call), until ``release`` is set
    (None: never; in a Ray actor, the thread ends with the actor)."""

    dp_size = 1

    def __init__(self, release: threading.Event | None = None) -> None:
        self.release = release

    def generate(self, batch, config):
        (self.release or threading.Event()).wait()
        raise RuntimeError("released")


def _request() -> GenerateRequest:
    return GenerateRequest("traj/0", [1, 2, 3], GenerationConfig(max_new_tokens=4))


def _wait_for(condition, what: str = "the request never started") -> None:
    deadline = time.monotonic() + 60
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_a_pause_on_a_hung_engine_gives_up_after_pause_timeout_s() -> None:
    """A weight sync pauses generation until the running requests are answered; with an engine hung in its call,
    pause() raises after pause_timeout_s (the pipeline passes actor_infer.rpc_timeout_s) an error that says how many
    requests were still running, after how long, and which setting to raise. Before, it waited forever."""
    release = threading.Event()
    endpoint = PolicyEndpoint(_HungEngine(release), 0, remote=False, gated=True, pause_timeout_s=0.2)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)  # the background rollouts' loop
    thread.start()
    try:
        asyncio.run_coroutine_threadsafe(endpoint.client.generate(_request()), loop)
        _wait_for(lambda: endpoint.client.in_flight == 1)
        with pytest.raises(PauseTimeoutError) as caught:
            endpoint.pause()
    finally:
        release.set()
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=30)
    assert caught.value.running == 1
    assert str(caught.value) == (
        "1 generation request still running after waiting 0.2 s to pause generation for a weight sync (a hung "
        "inference engine?); actor_infer.rpc_timeout_s=0.2 bounds this wait, as it bounds every actor_infer call: "
        "raise it if generation is legitimately that slow"
    )


def test_a_pause_through_the_policy_server_gives_up_after_pause_timeout_s(ray_session) -> None:
    """env_workers: ray: the gate lives in the PolicyServer actor; its pause is bounded the same way and the driver
    gets the same error (not a Ray task error, nor a wait without end)."""
    ship_module_by_value(__name__)
    endpoint = PolicyEndpoint(_HungEngine(), 0, remote=True, gated=True, pause_timeout_s=0.2)
    server = endpoint.server
    try:
        server.generate.remote(_request())
        _wait_for(lambda: ray.get(server.__ray_call__.remote(lambda actor: actor.client.in_flight)) == 1)
        with pytest.raises(PauseTimeoutError) as caught:
            endpoint.pause()
    finally:
        endpoint.close()
    assert caught.value.running == 1
    assert str(caught.value).startswith("1 generation request still running after waiting 0.2 s to pause")
    assert "raise it if generation is legitimately that slow" in str(caught.value)


def _server_in_flight(server) -> int:
    return ray.get(server.__ray_call__.remote(lambda actor: actor.client.in_flight))


def test_a_request_cancelled_on_its_side_leaves_the_policy_server(ray_session) -> None:
    """env_workers: ray: a request whose caller is cancelled (its episode stopped) is cancelled in the PolicyServer
    too, so a weight sync's pause no longer waits for it. Before, the server kept waiting for the engine's answer
    with the request counted as running, and the pause ran out its whole timeout and failed."""
    ship_module_by_value(__name__)
    endpoint = PolicyEndpoint(_HungEngine(), 0, remote=True, gated=True, pause_timeout_s=10)
    server = endpoint.server
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)  # an EnvironmentWorker's loop
    thread.start()
    try:
        request = asyncio.run_coroutine_threadsafe(endpoint.client.generate(_request()), loop)
        _wait_for(lambda: _server_in_flight(server) == 1)
        loop.call_soon_threadsafe(request.cancel)
        _wait_for(lambda: _server_in_flight(server) == 0, "the server still counts the cancelled request")
        endpoint.pause()  # nothing left to wait for
        endpoint.resume()
    finally:
        endpoint.close()
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=30)
    assert request.cancelled()


class _PauseNeverAnswers:
    """A hosted client whose pause never returns (a policy server actor stuck in a call)."""

    async def pause(self, timeout_s: float | None = None) -> None:
        await asyncio.sleep(3600)


def test_a_policy_server_that_never_answers_the_pause_is_named(ray_session, monkeypatch) -> None:
    """The driver bounds its wait for the policy server's answer too (the pause timeout plus a margin), and says that
    the server, not a request, did not answer, with the setting that bounds the wait."""
    import roll.agentic.pipeline.rollouts as rollouts
    from roll.agentic.policy import serve_policy

    ship_module_by_value(__name__)
    monkeypatch.setattr(rollouts, "_SERVER_ANSWER_S", 0.5)
    endpoint = PolicyEndpoint(_HungEngine(), 0, remote=False, gated=True, pause_timeout_s=0.2)
    endpoint.server = serve_policy(_PauseNeverAnswers())
    try:
        with pytest.raises(PauseTimeoutError) as caught:
            endpoint.pause()
    finally:
        endpoint.close()
    assert caught.value.running is None
    assert str(caught.value) == (
        "the policy server did not answer a pause within 0.7 s (its actor is busy or hung); "
        "actor_infer.rpc_timeout_s=0.2 bounds this wait, as it bounds every actor_infer call: raise it if generation "
        "is legitimately that slow"
    )
