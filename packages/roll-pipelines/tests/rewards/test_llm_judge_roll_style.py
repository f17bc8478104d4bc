"""llm_judge with ``prompt_style: ROLL/<judge_prompt>``: ROLL's template, question cut and yes/no answer rule.

Values follow ROLL's LLMJudgeRewardWorker at HEAD (``_format_judge_prompt``, ``_extract_score_v2``). The worker runs
on a tiny local model's tokenizer with a scripted generate() that answers what each row's response says.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch

from roll.pipelines.rewards import LLMJudgeRewardWorker
from roll.pipelines.rewards.judge_styles import (
    ROLL_JUDGE_PROMPTS,
    format_roll_judge_prompt,
    roll_judge_question,
    roll_yes_no_verdict,
)
from roll.pipelines.rlvr.sections import RewardConfig
from roll.protocol import DataProto, Dispatch, register
from roll.runtime import ConfigError
from roll.strategies.generation import build_generation_output, prompt_token_lists
from roll.strategies.mock.strategy import MockInferStrategy

QWEN = "ROLL/Qwen2.5-7B-Instruct-RLVR-prompt"
ROW = {"prompt": "system\nBe brief.\nuser\nWhat is 2 + 2?\n", "response_text": "The answer is 4.", "ground_truth": 4}
EXPECTED_QWEN = """
Below are a problem, a (possibly unfinished) solution process and a reference answer. Decide whether the final \
answer reached by the solution process is the same as the reference answer.
The reference answer can be a single option letter (such as A, B, C or D), a number, an expression, or a list of \
answers when the problem holds several questions.
**The reference answer may be written in Chinese or in another language; judge the answers regardless of language.**

What to do:
- Compare the final result of the solution process with the reference answer.
- If the two are **exactly the same**, answer **YES**.
- If they **differ**, answer **NO**.
- If the solution process is unclear, unfinished or ambiguous, treat it as wrong and answer **NO**.

Answer with exactly **'YES'** or **'NO'** and nothing else: no other words, no punctuation, no explanation.

---

**Question:**
What is 2 + 2?

**Solution Process (Final Step Only):**
The answer is 4.

**Reference Answer:**
4

**Output:**
"""


def test_qwen_template_renders_a_fixed_row_exactly() -> None:
    assert format_roll_judge_prompt(ROLL_JUDGE_PROMPTS["Qwen2.5-7B-Instruct-RLVR-prompt"], ROW) == EXPECTED_QWEN


def test_default_template_and_missing_reference() -> None:
    row = {"prompt": "Name a prime.", "response_text": "7"}
    text = format_roll_judge_prompt(ROLL_JUDGE_PROMPTS["default"], row)
    assert "\nPrompt: Name a prime.\n\nResponse: 7\n\nReference: None\n\n" in text  # ROLL formats None as "None"
    assert text.rstrip().endswith("Write your rating as: Score: your score.")


@pytest.mark.parametrize(
    ("prompt", "question"),
    [
        ("What is 2 + 2?", "What is 2 + 2?"),  # no "user\n": kept as is (not stripped)
        ("  padded  ", "  padded  "),
        ("system\nBe brief.\nuser\n  Q1  \n", "Q1"),  # after the last "user\n", stripped
        ("user\nfirst\nuser\nsecond\nassistant\n", "second\nassistant"),
        ("a user\nb", "b"),  # ROLL's plain substring split
    ],
)
def test_question_is_cut_after_the_last_user_line(prompt: str, question: str) -> None:
    assert roll_judge_question(prompt) == question


@pytest.mark.parametrize(
    ("answer", "score", "reason"),
    [
        ("yes", 1.0, "judge yes: yes"),
        ("No", 0.0, "judge no: No"),
        ("YES.", 1.0, "judge yes: YES."),
        ("garbage", 0.0, "unparseable judge output (neither yes nor no): garbage"),
        ("", 0.0, "unparseable judge output: empty answer (neither yes nor no)"),
        ("  \n", 0.0, "unparseable judge output: empty answer (neither yes nor no)"),
        ("Not sure", 0.0, "judge no: Not sure"),  # 'no' anywhere, as in ROLL
        ("No... well, yes", 1.0, "judge yes: No... well, yes"),  # 'yes' is looked for first
        ("Score: 9", 0.0, "unparseable judge output (neither yes nor no): Score: 9"),  # ROLL reads no number
    ],
)
def test_answers_score_by_rolls_yes_no_rule(answer: str, score: float, reason: str) -> None:
    assert roll_yes_no_verdict(answer) == (score, reason)


def test_malformed_answer_score_and_quote_length() -> None:
    assert roll_yes_no_verdict("maybe", unparseable_score=-1.0, reason_chars=0) == (
        -1.0,
        "unparseable judge output (neither yes nor no)",
    )
    assert roll_yes_no_verdict("YES " + "x" * 50, reason_chars=10) == (1.0, "judge yes: YES xxx...")


# --- the worker -----------------------------------------------------------------------------------------------
def _role(model: Path | str, **kwargs: Any) -> RewardConfig:
    return RewardConfig(
        name="judge",
        reward_type="llm_judge",
        model_args={"model_name_or_path": str(model), "dtype": "float32"},
        strategy_args={"strategy_name": "mock_infer"},
        reward_kwargs=kwargs,
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"prompt_style": "ROLL/nope"}, "prompt_style 'ROLL/nope' is not one of \\['roll', 'ROLL/Qwen2.5"),
        ({"prompt_style": "qwen"}, "is not one of"),
        ({"prompt_style": QWEN, "max_score": 1}, "\\['max_score'\\] are roll's own judge settings"),
        ({"prompt_style": QWEN, "prompt_template": "{response}"}, "unused with prompt_style"),
    ],
)
def test_bad_roll_styles_fail_before_the_model_loads(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        LLMJudgeRewardWorker(_role("/nonexistent/judge", **kwargs)).initialize(None)


_SOLUTION = re.compile(r"\*\*Solution Process \(Final Step Only\):\*\*\n(.*?)\n\n", re.DOTALL)


class EchoJudgeStrategy(MockInferStrategy):
    """Answers each judge prompt with the response shown in it; records the decoded prompts."""

    def initialize(self) -> None:
        from roll.pipelines.tokenizers import load_tokenizer

        super().initialize()
        self.tokenizer = load_tokenizer(self.model_args)
        self.shown: list[str] = []

    def generate(self, batch: DataProto, generation_config: Any) -> DataProto:
        responses = []
        for ids in prompt_token_lists(batch):
            shown = self.tokenizer.decode(ids, skip_special_tokens=False)
            self.shown.append(shown)
            answer = _SOLUTION.search(shown).group(1)
            responses.append([*self.tokenizer.encode(answer, add_special_tokens=False), self.tokenizer.eos_token_id])
        return build_generation_output(
            batch,
            responses,
            None,
            ["stop"] * len(responses),
            num_return_sequences=1,
            max_new_tokens=generation_config.max_new_tokens,
            pad_token_id=self.tokenizer.pad_token_id,
        )


class EchoJudge(LLMJudgeRewardWorker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL, clear_cache=False)
    def initialize(self, settings: Any = None) -> None:
        super().initialize(settings)
        self.strategy = EchoJudgeStrategy(self, self.strategy.config)
        self.strategy.initialize()
        self.tokenizer = self.strategy.tokenizer


@pytest.fixture(scope="module")
def tiny_judge(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from roll.strategies.testing import make_tiny_causal_lm

    return make_tiny_causal_lm(tmp_path_factory.mktemp("tiny_roll_judge"), preset="nano")


def test_worker_scores_two_rows_with_rolls_template_and_rule(tiny_judge: Path) -> None:
    worker = EchoJudge(_role(tiny_judge, prompt_style=QWEN, max_new_tokens=16))
    worker.initialize(None)
    rows = DataProto.from_dict(
        {"response_mask": torch.ones(2, 3, dtype=torch.long)},
        {
            "prompt": [ROW["prompt"], "user\nWhat is 3 + 3?"],
            "response_text": ["The answer is 4.", "NO"],
            "ground_truth": [4, "6"],
            "tag": ["RLVR", "RLVR"],
        },
    )
    out = worker.compute_rewards(rows)
    # The judge echoes each response: "The answer is 4." holds neither "yes" nor "no" (malformed: 0), "NO" is no (0).
    assert out["scores"].tolist() == [0.0, 0.0]
    assert out["reward_info"].tolist() == [
        "unparseable judge output (neither yes nor no): The answer is 4.",
        "judge no: NO",
    ]
    # What the judge model was sent: the exact template text as one user message of the tokenizer's chat template.
    assert worker.strategy.shown[0] == f"<|im_start|>user\n{EXPECTED_QWEN}<|im_end|>\n<|im_start|>assistant\n"
    assert "**Question:**\nWhat is 3 + 3?\n\n" in worker.strategy.shown[1]
    yes = worker.compute_rewards(
        DataProto.from_dict(
            {"response_mask": torch.ones(1, 3, dtype=torch.long)},
            {"prompt": ["Q"], "response_text": ["YES."], "ground_truth": ["x"], "tag": ["RLVR"]},
        )
    )
    assert yes["scores"].tolist() == [1.0] and yes["reward_info"].tolist() == ["judge yes: YES."]
