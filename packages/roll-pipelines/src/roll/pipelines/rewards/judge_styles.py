"""ROLL's LLM-judge semantics, selected by ``reward_kwargs.prompt_style`` of roll's ``llm_judge`` reward.

``prompt_style: roll`` (the default) is roll's own judge: ``prompt_template`` and a numeric score. The other styles
are ROLL's ``LLMJudgeRewardWorker`` (roll/pipeline/rlvr/rewards/llm_judge_reward_worker.py at HEAD), one per name
of ROLL's ``judge_prompt`` table (roll/utils/prompt.py ``prompt_maps``) plus ``ROLL/default``, the prompt ROLL
falls back to when ``judge_prompt`` is unset or not in its table:

* the question is the row's prompt text; when it contains ``"user\\n"`` only what follows the last one, stripped,
  is kept (ROLL's ``_format_judge_prompt``, which reads the decoded prompt);
* the template is filled with ``{question}``, ``{response}`` and ``{reference}`` (the reference column as text,
  ``None`` when the row has none) and sent as one user message;
* the answer is read by ROLL's rule (``_extract_score_v2``): lower-cased, containing ``yes`` anywhere scores 1,
  else containing ``no`` anywhere scores 0, else (malformed, empty) 0. ROLL applies this rule whatever the
  template asks for, ``ROLL/default``'s "Score: N" included.

The template texts are roll's own wording of ROLL's: same instructions, sections and placeholders.
"""

from __future__ import annotations

from typing import Any

from roll.pipelines.rewards.base import ScoredRow

__all__ = [
    "ROLL_JUDGE_PROMPTS",
    "ROLL_STYLE_PREFIX",
    "format_roll_judge_prompt",
    "roll_judge_question",
    "roll_judge_template",
    "roll_yes_no_verdict",
]

ROLL_STYLE_PREFIX = "ROLL/"

# ROLL's prompt_maps["Qwen2.5-7B-Instruct-RLVR-prompt"]: does the solution's final answer match the reference?
_QWEN25_RLVR = """
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
{question}

**Solution Process (Final Step Only):**
{response}

**Reference Answer:**
{reference}

**Output:**
"""

# ROLL's built-in prompt when judge_prompt is unset or unknown: a 0-10 rating (still read by the yes/no rule).
_DEFAULT = """
You are an expert judge rating how good a response to a prompt is.

Prompt: {question}

Response: {response}

Reference: {reference}

Rate the response from 0 to 10, weighing its correctness, completeness, clarity and relevance to the prompt.
Your rating is a single number between 0 and 10.
Write your rating as: Score: your score.
"""

# judge_prompt name (as ROLL's configs spell it) -> template; "default" is ROLL's fallback.
ROLL_JUDGE_PROMPTS: dict[str, str] = {
    "Qwen2.5-7B-Instruct-RLVR-prompt": _QWEN25_RLVR,
    "default": _DEFAULT,
}


def roll_judge_template(style: str) -> str:
    """The template of a ``ROLL/<name>`` style; ValueError naming the known styles otherwise."""
    name = style[len(ROLL_STYLE_PREFIX) :] if style.startswith(ROLL_STYLE_PREFIX) else None
    if name not in ROLL_JUDGE_PROMPTS:
        known = ["roll", *(ROLL_STYLE_PREFIX + key for key in ROLL_JUDGE_PROMPTS)]
        raise ValueError(f"reward_kwargs.prompt_style {style!r} is not one of {known}")
    return ROLL_JUDGE_PROMPTS[name]


def roll_judge_question(prompt: str) -> str:
    """ROLL's question text: what follows the last ``"user\\n"`` (stripped) when there is one, else ``prompt``."""
    return prompt.split("user\n")[-1].strip() if "user\n" in prompt else prompt


def format_roll_judge_prompt(template: str, row: dict[str, Any], reference_key: str | None = "ground_truth") -> str:
    """One row's judge prompt under a ROLL template (non-tensor columns ``prompt``, ``response_text``, reference)."""
    reference = row.get(reference_key) if reference_key else None
    return template.format(
        question=roll_judge_question(str(row.get("prompt") or "")),
        response=str(row.get("response_text") or ""),
        reference=str(reference),
    )


def roll_yes_no_verdict(output: str, *, unparseable_score: float = 0.0, reason_chars: int = 120) -> ScoredRow:
    """ROLL's reading of a judge answer: ``yes`` anywhere (any case) 1.0, else ``no`` anywhere 0.0, else malformed."""
    text = " ".join(output.split())
    quoted = f": {text if len(text) <= reason_chars else text[: max(0, reason_chars - 3)] + '...'}"
    quoted = quoted if reason_chars > 0 else ""
    lowered = output.lower()
    if "yes" in lowered:
        return 1.0, f"judge yes{quoted}"
    if "no" in lowered:
        return 0.0, f"judge no{quoted}"
    if not text:
        return float(unparseable_score), "unparseable judge output: empty answer (neither yes nor no)"
    return float(unparseable_score), f"unparseable judge output (neither yes nor no){quoted}"
