"""LLM-as-judge over an OpenAI-compatible chat API (``reward_type: llm_judge_api``): no judge model in the run.

The judge prompt and the reading of the answer are :class:`~roll.pipelines.rewards.llm_judge.LLMJudgeRewardWorker`'s
(``prompt_template`` / ``prompt_style``, ``score_pattern``, ``min_score`` / ``max_score``...); each row is one
``POST {api_url}/chat/completions`` with the system prompt (if any) and the judge prompt as messages::

    rewards:
      helpful:
        reward_type: llm_judge_api
        reward_kwargs: {api_url: "https://judge.example/v1", model: qwen2.5-72b, api_key_env: JUDGE_KEY,
                        num_workers: 8}

``reward_kwargs`` beside the judge's: ``api_url`` (the base URL, ending before ``/chat/completions``), ``model``,
``api_key`` or ``api_key_env`` (the name of an environment variable holding it; no key: no Authorization header),
``timeout_s`` (60), ``retries`` (3: a refused connection, a timeout, HTTP 429 or 5xx is tried again after 1, 2, 4 s;
other HTTP errors are not), ``body`` (extra request fields, e.g. ``{top_p: 0.9}``), and ``num_workers``, the
requests in flight per reward worker. ``max_new_tokens`` and ``temperature`` go in the request as ``max_tokens`` and
``temperature``. A row whose request fails scores ``unparseable_score`` with the error as its reason; a batch in which
every request failed stops the run with one error naming the URL (a judge that is down must not train the policy on
zeros). This is ROLL's ``judge_model_type: api`` (``judge_api_url``, ``judge_api_key``, ``judge_model_name``).
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from typing import Any, ClassVar

from roll.pipelines.rewards.base import RewardWorker, ScoredRow
from roll.pipelines.rewards.llm_judge import JudgeScoring
from roll.pipelines.validate import ServiceUnreachableError
from roll.runtime import ConfigError, DataProto, Dispatch, register

__all__ = ["ApiJudgeRewardWorker", "JudgeApiError"]

_FAILED = "judge API request failed"
_RETRIED_STATUS = (429, 500, 502, 503, 504)


class JudgeApiError(RuntimeError):
    """One judge request failed (after its retries)."""


class ApiJudgeRewardWorker(JudgeScoring, RewardWorker):
    """Scores rows with a judge behind an OpenAI-compatible chat API (see the module docstring)."""

    required_fields: ClassVar[tuple[tuple[str, ...], ...]] = ()
    default_kwargs: ClassVar[dict[str, Any]] = {
        **JudgeScoring.judge_kwargs,
        "api_url": None,
        "model": None,
        "api_key": None,
        "api_key_env": None,
        "timeout_s": 60.0,
        "retries": 3,
        "body": {},
    }

    def setup(self, kwargs: dict[str, Any]) -> None:
        self.setup_judge(kwargs)
        url = kwargs["api_url"]
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ConfigError(f"reward_kwargs.api_url must be the judge API's http(s) base URL, got {url!r}")
        if not isinstance(kwargs["model"], str) or not kwargs["model"]:
            raise ConfigError("reward_kwargs.model must name the judge model the API serves")
        key, env = kwargs["api_key"], kwargs["api_key_env"]
        if key is not None and env is not None:
            raise ConfigError("reward_kwargs.api_key and api_key_env are both set; keep one")
        if env is not None:
            key = os.environ.get(str(env))
            if not key:
                raise ConfigError(f"reward_kwargs.api_key_env={env!r}: that environment variable is not set here")
        self.api_key: str | None = key
        self.endpoint = url.rstrip("/") + "/chat/completions"
        timeout, retries = kwargs["timeout_s"], kwargs["retries"]
        if not isinstance(timeout, int | float) or isinstance(timeout, bool) or timeout <= 0:
            raise ConfigError(f"reward_kwargs.timeout_s must be a positive number, got {timeout!r}")
        if not isinstance(retries, int) or isinstance(retries, bool) or retries < 0:
            raise ConfigError(f"reward_kwargs.retries must be an integer >= 0, got {retries!r}")
        if not isinstance(kwargs["body"], dict):
            raise ConfigError(f"reward_kwargs.body must be a mapping of request fields, got {kwargs['body']!r}")

    def messages(self, row: dict[str, Any]) -> list[dict[str, str]]:
        system = self.reward_kwargs["system_prompt"]
        user = {"role": "user", "content": self.judge_prompt(row)}
        return [{"role": "system", "content": str(system)}, user] if system else [user]

    def ask(self, messages: list[dict[str, str]]) -> tuple[str, str]:
        """The judge's ``(answer, finish_reason)``; JudgeApiError after the retries."""
        kwargs = self.reward_kwargs
        body = {
            **kwargs["body"],
            "model": kwargs["model"],
            "messages": messages,
            "max_tokens": kwargs["max_new_tokens"],
            "temperature": kwargs["temperature"],
        }
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        data = json.dumps(body).encode()
        for attempt in range(kwargs["retries"] + 1):
            request = urllib.request.Request(self.endpoint, data=data, headers=headers, method="POST")
            try:
                with urllib.request.urlopen(request, timeout=kwargs["timeout_s"]) as response:
                    answer = json.loads(response.read())
                choice = answer["choices"][0]
                return str(choice["message"].get("content") or ""), str(choice.get("finish_reason") or "stop")
            except urllib.error.HTTPError as e:
                detail = e.read()[:200].decode(errors="replace")
                error = f"HTTP {e.code} from {self.endpoint}: {detail}"
                if e.code not in _RETRIED_STATUS:
                    raise JudgeApiError(error) from None
            except (urllib.error.URLError, TimeoutError, ConnectionError) as e:
                error = f"{self.endpoint} did not answer: {getattr(e, 'reason', e)}"
            except (KeyError, IndexError, TypeError, ValueError) as e:
                raise JudgeApiError(f"{self.endpoint} answered without choices[0].message: {e!r}") from None
            if attempt < kwargs["retries"]:
                time.sleep(2.0**attempt)
        raise JudgeApiError(error)

    def score_row(self, row: dict[str, Any]) -> ScoredRow:
        try:
            text, finish_reason = self.ask(self.messages(row))
        except JudgeApiError as e:
            return self.unparseable_score, f"{_FAILED}: {e}"[:300]
        return self.verdict(text, finish_reason)

    @register(dispatch_mode=Dispatch.DP_MP_COMPUTE, clear_cache=False)
    def compute_rewards(self, batch: DataProto) -> DataProto:
        """Every row's score, as any reward worker; an error when no request of the batch got an answer."""
        out = super().compute_rewards(batch)
        reasons = [str(reason) for reason in out.non_tensor_batch["reward_info"]]
        if reasons and all(reason.startswith(_FAILED) for reason in reasons):
            raise ServiceUnreachableError(
                f"{self.worker_name}: every judge request of this batch failed ({len(reasons)}), e.g. {reasons[0]}; "
                "check reward_kwargs.api_url, the key and that the judge serves reward_kwargs.model"
            )
        return out
