"""``llm_judge_api``: the judge behind an OpenAI-compatible chat API (a local fake server here), ROLL's api mode."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from roll.pipelines.rewards import judge_api, resolve_reward_worker
from roll.pipelines.rewards.judge_api import ApiJudgeRewardWorker
from roll.pipelines.validate import ServiceUnreachableError
from roll.runtime import ConfigError, DataProto, WorkerConfig


class JudgeRole(WorkerConfig):
    reward_type: str = "llm_judge_api"
    reward_kwargs: dict = {}


class FakeJudge(BaseHTTPRequestHandler):
    """Answers ``Score: 8`` when the prompt holds the reference (Paris), else ``Score: 2``; first answers with the
    statuses listed in the server's ``fail``; records every request in its ``seen``."""

    def do_POST(self) -> None:
        server: Any = self.server
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        server.seen.append((self.path, dict(self.headers), body))
        if server.fail:
            status = server.fail.pop(0)
            self.send_response(status)
            self.end_headers()
            self.wfile.write(b'{"error": "busy"}')
            return
        prompt = body["messages"][-1]["content"]
        score = 8 if "Paris" in prompt else 2
        answer = {
            "choices": [{"message": {"role": "assistant", "content": f"Score: {score}"}, "finish_reason": "stop"}]
        }
        payload = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def judge() -> Iterator[Any]:
    server: Any = ThreadingHTTPServer(("127.0.0.1", 0), FakeJudge)
    server.seen, server.fail = [], []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture(autouse=True)
def no_waiting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(judge_api.time, "sleep", lambda seconds: None)  # the retry back-off


def _worker(url: str, **kwargs: Any) -> ApiJudgeRewardWorker:
    worker = ApiJudgeRewardWorker(JudgeRole(name="judge", reward_kwargs={"api_url": url, "model": "j", **kwargs}))
    worker.initialize(None)
    return worker


def _batch(*answers: str) -> DataProto:
    n = len(answers)
    return DataProto.from_dict(
        non_tensors={
            "prompt": ["Capital of France?"] * n,
            "response_text": list(answers),
            "ground_truth": ["Paris"] * n,
            "tag": ["qa"] * n,
        }
    )


def test_each_row_is_one_chat_request_and_its_answer_is_read_as_the_judges(judge, monkeypatch) -> None:
    monkeypatch.setenv("JUDGE_KEY", "secret")
    url = f"http://127.0.0.1:{judge.server_port}/v1"
    worker = _worker(url + "/", api_key_env="JUDGE_KEY", system_prompt="Be strict.", body={"top_p": 0.5})
    out = worker.compute_rewards(_batch("Paris.", "Lyon."))
    assert out["scores"].tolist() == pytest.approx([0.8, 0.8])  # the reference is in both prompts: 8/10
    path, headers, body = judge.seen[0]
    assert path == "/v1/chat/completions" and headers["Authorization"] == "Bearer secret"
    assert body["model"] == "j" and body["max_tokens"] == 64 and body["temperature"] == 0.0 and body["top_p"] == 0.5
    assert [m["role"] for m in body["messages"]] == ["system", "user"] and "Paris." in json.dumps(judge.seen)
    assert resolve_reward_worker("llm_judge_api") is ApiJudgeRewardWorker


def test_busy_answers_are_retried_and_a_refused_request_is_the_rows_reason(judge) -> None:
    url = f"http://127.0.0.1:{judge.server_port}/v1"
    judge.fail = [503, 429]
    out = _worker(url, retries=2, num_workers=1).compute_rewards(_batch("Paris."))
    assert out["scores"].tolist() == pytest.approx([0.8]) and len(judge.seen) == 3
    judge.fail = [400]
    out = _worker(url, retries=2, num_workers=1).compute_rewards(_batch("Paris.", "Paris."))
    reasons = out["reward_info"].tolist()
    assert out["scores"].tolist() == pytest.approx([0.0, 0.8])  # 400 is not retried: that row only fails
    assert reasons[0].startswith("judge API request failed: HTTP 400 from") and '"busy"' in reasons[0]


def test_a_judge_that_answers_no_request_stops_the_run(judge) -> None:
    url = f"http://127.0.0.1:{judge.server_port}/v1"
    judge.shutdown()
    judge.server_close()
    with pytest.raises(ServiceUnreachableError, match=r"every judge request of this batch failed \(2\)"):
        _worker(url, retries=1, timeout_s=2).compute_rewards(_batch("a", "b"))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"api_url": "judge.example"}, "api_url must be the judge API's http"),
        ({"model": ""}, "model must name the judge model"),
        ({"api_key": "a", "api_key_env": "B"}, "api_key and api_key_env are both set"),
        ({"api_key_env": "ROLL_TEST_NO_SUCH_VAR"}, "that environment variable is not set"),
        ({"retries": -1}, "retries must be an integer >= 0"),
        ({"prompt_style": "ROLL/default", "max_score": 5}, "roll's own judge settings"),
    ],
)
def test_bad_settings_name_the_field(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _worker(kwargs.pop("api_url", "http://127.0.0.1:9/v1"), **kwargs)
