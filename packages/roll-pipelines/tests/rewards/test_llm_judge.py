"""The llm_judge reward: score parsing and prompt rendering, settings validation, and the worker end to end.

The worker runs on the mock backend with a scripted generate() (so the judge "says" what a test wants and the
whole path - template, chat formatting, one batched generate, decoding, parsing - is checked), in-process and
as a Ray cluster of two, and on hf_infer with a random tiny model (plumbing only: it cannot judge).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch

from roll.pipelines.rewards import (
    DEFAULT_JUDGE_TEMPLATE,
    REWARDS,
    LLMJudgeRewardWorker,
    format_judge_prompt,
    judge_verdict,
    parse_judge_score,
    resolve_reward_worker,
)
from roll.pipelines.rlvr.sections import RewardConfig
from roll.protocol import DataProto, Dispatch, register
from roll.runtime import Cluster, ConfigError
from roll.runtime.testing import ship_module_by_value
from roll.strategies.generation import build_generation_output, prompt_token_lists
from roll.strategies.mock.strategy import MockInferStrategy

ship_module_by_value(__name__)


# --- parsing ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Score: 7", 7.0),
        ("The response is right.\nScore: 9", 9.0),
        ("**Score:** 8", 8.0),
        ("**Score**: 8/10", 8.0),
        ("Rating: [[6]]", 6.0),
        ("final score is 6.5", 6.5),
        ("score = 10", 10.0),
        ("Score: 3 ... on reflection, Score: 5", 5.0),  # the last verdict wins
        ("The answer deserves \\boxed{4}.", 4.0),
        ("I would give it 7/10.", 7.0),
        ("7/8 of it is right, overall 3/10", 3.0),  # only fractions over max_score count
        ("Score: 11", None),  # off the scale
        ("Score: -1", None),
        ("This is a good answer.", None),
        ("", None),
    ],
)
def test_parse_default_patterns(text: str, expected: float | None) -> None:
    assert parse_judge_score(text, max_score=10) == expected


def test_keyword_beats_boxed_and_fraction() -> None:
    assert parse_judge_score("\\boxed{2} and 4/10, but Score: 9") == 9.0
    assert parse_judge_score("\\boxed{2} and 4/10") == 2.0


def test_custom_patterns_and_scales() -> None:
    assert parse_judge_score("verdict <3> then <4>", pattern=r"<(\d)>") == 4.0
    assert parse_judge_score("A:1 grade=5", pattern=r"grade=(?P<score>\d+)", max_score=5) == 5.0
    assert parse_judge_score("yes 8", pattern=r"\d+") == 8.0  # no group: the whole match
    assert parse_judge_score("Score: 8", pattern=r"<(\d)>") is None  # a custom pattern replaces the defaults
    assert parse_judge_score("Score: 0", min_score=1, max_score=5) is None
    assert parse_judge_score("Score: 3", min_score=1, max_score=5) == 3.0


def test_verdicts_normalise_and_explain() -> None:
    assert judge_verdict("Good.\nScore: 4", min_score=1, max_score=5) == (0.75, "judge 4/5: Good. Score: 4")
    assert judge_verdict("Score: 10") == (1.0, "judge 10/10: Score: 10")
    assert judge_verdict("Score: 0", reason_chars=0) == (0.0, "judge 0/10")
    assert judge_verdict("meh", unparseable_score=-1.0) == (-1.0, "unparseable judge output: meh")
    assert judge_verdict("Score: 42")[1] == "unparseable judge output: 42 is outside [0, 10]: Score: 42"
    assert judge_verdict("   ")[1] == "unparseable judge output: empty answer"
    score, reason = judge_verdict("I think the answer " * 20, finish_reason="length", reason_chars=30)
    assert score == 0.0
    assert reason.startswith("unparseable judge output (cut at max_new_tokens): I think")
    assert len(reason.split(": ", 1)[1]) <= 30


def test_prompt_rendering() -> None:
    row = {"prompt": "What is 2 + 2?", "response_text": "It is {4}.", "ground_truth": "4"}
    text = format_judge_prompt(DEFAULT_JUDGE_TEMPLATE, row)
    assert "[Question]\nWhat is 2 + 2?" in text and "[Response]\nIt is {4}." in text
    assert "[Reference answer]\n4" in text and "from 0 to 10" in text
    assert "(none given)" in format_judge_prompt(DEFAULT_JUDGE_TEMPLATE, {**row, "ground_truth": None})
    assert "(none given)" in format_judge_prompt(DEFAULT_JUDGE_TEMPLATE, row, reference_key=None)
    custom = "{{json}} Q={prompt} R={response} ref={reference} scale {min_score}-{max_score}"
    rendered = format_judge_prompt(custom, row, reference_key="answer", no_reference_text="-", max_score=5.0)
    assert rendered == "{json} Q=What is 2 + 2? R=It is {4}. ref=- scale 0-5"


def test_registered_without_required_fields() -> None:
    assert REWARDS.get("llm_judge") is LLMJudgeRewardWorker
    assert resolve_reward_worker("llm_judge").required_fields == ()


# --- the worker -----------------------------------------------------------------------------------------
def _role(model: Path | str | None, **overrides: Any) -> RewardConfig:
    settings: dict[str, Any] = {
        "name": "judge",
        "reward_type": "llm_judge",
        "model_args": {"model_name_or_path": str(model) if model else None, "dtype": "float32"},
        "strategy_args": {"strategy_name": "mock_infer"},
    }
    settings.update(overrides)
    return RewardConfig(**settings)


@pytest.fixture(scope="module")
def tiny_judge(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from roll.strategies.testing import make_tiny_causal_lm

    return make_tiny_causal_lm(tmp_path_factory.mktemp("tiny_judge"), preset="nano")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"prompt_template": "Rate {response} for {question}"}, "unknown placeholders \\['question'\\]"),
        ({"prompt_template": "Rate {prompt}"}, "must contain \\{response\\}"),
        ({"prompt_template": "Rate {response"}, "not a valid template"),
        ({"max_score": 0}, "must be larger than min_score"),
        ({"max_score": "ten"}, "max_score must be a finite number"),
        ({"score_pattern": "(unclosed"}, "not a valid regex"),
        ({"generation": {"num_return_sequences": 4}}, "one answer per row"),
        ({"generation": {"max_new_tokens": 9}}, "set reward_kwargs.max_new_tokens instead"),
        ({"generation": {"top_p": 3.0}}, "generation settings"),
        ({"max_prompt_length": 0}, "max_prompt_length must be an integer >= 1"),
        ({"judge_model": "gpt"}, "unknown reward_kwargs \\['judge_model'\\]"),
    ],
)
def test_bad_settings_fail_before_the_model_loads(kwargs: dict[str, Any], message: str) -> None:
    worker = LLMJudgeRewardWorker(_role("/nonexistent/judge", reward_kwargs=kwargs))
    with pytest.raises(ConfigError, match=message):
        worker.initialize(None)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"strategy_args": None}, "needs a model: set strategy_args"),
        ({"model_args": {"model_name_or_path": "tiny://nano"}}, "was not resolved to a local folder"),
        ({"generating_args": {"temperature": 0.5}}, "not generating_args"),
    ],
)
def test_bad_roles_are_explained(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        LLMJudgeRewardWorker(_role("/nonexistent/judge", **overrides)).initialize(None)


def test_mock_backend_needs_a_tokenizer() -> None:
    with pytest.raises(ConfigError, match="has no tokenizer"):
        LLMJudgeRewardWorker(_role(None)).initialize(None)


_RESPONSE_SECTION = re.compile(r"\[Response\]\n(.*?)\n\n", re.DOTALL)


class ScriptedJudgeStrategy(MockInferStrategy):
    """A judge that answers with the text of the response it is shown (so each row scripts its own verdict);
    an answer containing LONG is cut at max_new_tokens. Records the size of every generate() call."""

    def initialize(self) -> None:
        from roll.pipelines.tokenizers import load_tokenizer

        super().initialize()
        self.tokenizer = load_tokenizer(self.model_args)
        self.calls: list[int] = []
        self.settings: list[dict[str, Any]] = []

    def generate(self, batch: DataProto, generation_config: Any) -> DataProto:
        self.calls.append(len(batch))
        self.settings.append(generation_config.model_dump())
        responses, reasons = [], []
        for ids in prompt_token_lists(batch):
            shown = self.tokenizer.decode(ids, skip_special_tokens=True)
            answer = _RESPONSE_SECTION.search(shown).group(1)
            tokens = self.tokenizer.encode(answer, add_special_tokens=False)
            if "LONG" in answer:
                responses.append(tokens[: generation_config.max_new_tokens])
                reasons.append("length")
            else:
                responses.append([*tokens, self.tokenizer.eos_token_id])
                reasons.append("stop")
        return build_generation_output(
            batch,
            responses,
            None,
            reasons,
            num_return_sequences=1,
            max_new_tokens=generation_config.max_new_tokens,
            pad_token_id=self.tokenizer.pad_token_id,
        )


class ScriptedJudge(LLMJudgeRewardWorker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL, clear_cache=False)
    def initialize(self, settings: Any = None) -> None:
        super().initialize(settings)
        self.strategy = ScriptedJudgeStrategy(self, self.strategy.config)
        self.strategy.initialize()
        self.tokenizer = self.strategy.tokenizer

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def generate_calls(self) -> dict[str, Any]:
        return {"calls": self.strategy.calls, "settings": self.strategy.settings}


VERDICTS = [
    ("Clear and right.\nScore: 9", "4", 0.9, "judge 9/10: Clear and right. Score: 9"),
    ("Rating: 2", None, 0.2, "judge 2/10: Rating: 2"),
    ("\\boxed{10}", "4", 1.0, "judge 10/10: \\boxed{10}"),
    ("no number here", "4", 0.0, "unparseable judge output: no number here"),
    ("Score: 12", "4", 0.0, "unparseable judge output: 12 is outside [0, 10]: Score: 12"),
    ("LONG " * 40, "4", 0.0, "unparseable judge output (cut at max_new_tokens): LONG"),
]


def _rows(verdicts: list[tuple[str, str | None, float, str]]) -> DataProto:
    return DataProto.from_dict(
        {"response_mask": torch.ones(len(verdicts), 3, dtype=torch.long)},
        {
            "prompt": [f"What is {i} + 4?" for i in range(len(verdicts))],
            "response_text": [v[0] for v in verdicts],
            "ground_truth": [v[1] for v in verdicts],
            "tag": ["chat"] * len(verdicts),
        },
    )


def _check(out: DataProto, verdicts: list[tuple[str, str | None, float, str]]) -> None:
    assert len(out) == len(verdicts)
    assert out["scores"].dtype == torch.float32 and out["scores"].shape == (len(verdicts),)
    assert out["scores"].tolist() == pytest.approx([v[2] for v in verdicts])
    for reason, (_, _, _, expected) in zip(out["reward_info"].tolist(), verdicts):
        assert reason.startswith(expected), (reason, expected)


def test_scripted_judge_in_process_batches_rows_into_one_call(tiny_judge: Path) -> None:
    kwargs = {"max_new_tokens": 32, "generation": {"top_p": 0.5}, "max_prompt_length": 1000}
    worker = ScriptedJudge(_role(tiny_judge, reward_kwargs=kwargs))
    worker.initialize(None)
    too_long = ("x " * 1000, "4", 0.0, "judge prompt has ")
    verdicts = [*VERDICTS, too_long]
    out = worker.compute_rewards(_rows(verdicts))
    _check(out, verdicts)
    assert "tokens > max_prompt_length=1000; not judged" in out["reward_info"].tolist()[-1]
    assert worker.strategy.calls == [len(VERDICTS)]  # one generate for the whole shard; the long one not sent
    settings = worker.strategy.settings[0]
    assert settings["temperature"] == 0.0 and settings["max_new_tokens"] == 32 and settings["top_p"] == 0.5
    assert settings["num_return_sequences"] == 1
    # The template went through the tokenizer's chat template, with the reference where given.
    row = {"prompt": "What is 0 + 4?", "response_text": "Score: 9", "ground_truth": "4"}
    shown = worker.tokenizer.decode(worker.encode(worker.judge_prompt(row)))
    assert shown.startswith("<|im_start|>user\nYou are a strict and fair grader.")
    assert shown.endswith("<|im_start|>assistant\n") and "[Reference answer]\n4\n" in shown
    assert worker.score_rows([]) == [] and worker.strategy.calls == [len(VERDICTS)]


def test_scripted_judge_cluster_of_two_keeps_row_order(resources, tiny_judge: Path) -> None:
    role = _role(tiny_judge, world_size=2, reward_kwargs={"max_new_tokens": 32, "system_prompt": "Be terse."})
    cluster = Cluster("judge-scripted", ScriptedJudge, resources, role)
    try:
        cluster.initialize(None)
        _check(cluster.compute_rewards(_rows(VERDICTS)), VERDICTS)
        calls = cluster.generate_calls()
        assert [c["calls"] for c in calls] == [[3], [3]]  # each rank: its shard in one call
    finally:
        cluster.shutdown()


def test_hf_infer_judge_on_a_random_tiny_model(resources, tiny_judge: Path) -> None:
    """Plumbing through a real backend: a random model cannot judge, so every row is unparseable or in [0, 1]."""
    role = _role(
        tiny_judge,
        strategy_args={"strategy_name": "hf_infer", "strategy_config": {"device": "cpu"}},
        reward_kwargs={"max_new_tokens": 6},
    )
    cluster = Cluster("judge-hf", LLMJudgeRewardWorker, resources, role)
    try:
        cluster.initialize(None)
        out = cluster.compute_rewards(_rows(VERDICTS))
        again = cluster.compute_rewards(_rows(VERDICTS))
    finally:
        cluster.shutdown()
    scores = out["scores"]
    assert scores.shape == (len(VERDICTS),) and scores.dtype == torch.float32
    assert ((scores >= 0) & (scores <= 1)).all()
    for score, reason in zip(scores.tolist(), out["reward_info"].tolist()):
        assert reason.startswith(("judge ", "unparseable judge output")), reason
        assert (score == 0.0) or reason.startswith("judge ")
    assert again["reward_info"].tolist() == out["reward_info"].tolist()  # greedy by default
