"""Deterministic synthetic datasets for the tiny recipes, and the ``synthetic://`` URI resolver.

All generators draw from one pool of small arithmetic problems ("What is 12 + 7?"). Each problem belongs to
exactly one split (80% train, 10% eval, 10% test), decided by a hash of its *canonical key*
(:func:`problem_key`): the operands of ``+`` and ``*`` sorted, and one key per pair for the comparisons
("larger: 3 or 7", "larger: 7 or 3" and "smaller: 3 or 7" ask about the same pair). So a problem, its commuted
twin and its operand-swapped twins always share a split, whatever ``n``, ``seed`` or generator is used: an SFT
train set and an RL eval set are disjoint too. :func:`split_leaks` finds problems shared by two sets of prompts
under that key.
"""

from __future__ import annotations

import hashlib
import json
import operator
import os
import random
import re
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from roll.pipelines.data._work import column_addition
from roll.pipelines.data.errors import DataError

__all__ = [
    "SYNTHETIC_GENERATORS",
    "ArithmeticProblem",
    "arithmetic_problems",
    "arithmetic_prompts",
    "arithmetic_sft",
    "extract_boxed",
    "is_correct_arithmetic",
    "parse_arithmetic",
    "preference_pairs",
    "problem_key",
    "prompt_key",
    "resolve_data_uri",
    "solve_arithmetic",
    "split_leaks",
    "split_of",
]

# Bump when a generator's output changes, so cached files from older versions are not reused.
_GENERATOR_VERSION = 3
_OPS: dict[str, tuple[str, Callable[[int, int], int]]] = {
    "add": ("+", operator.add),
    "sub": ("-", operator.sub),
    "mul": ("*", operator.mul),
    # Comparisons: the answer is one of the operands, so a small model can learn a rule that generalizes to
    # unseen pairs (copy the larger one) instead of memorizing a table of facts.
    "max": ("max", max),
    "min": ("min", min),
}
_WORDS = {"max": "larger", "min": "smaller"}
# Operators whose operands can be swapped without changing the problem.
_COMMUTATIVE = frozenset({"+", "*", "max", "min"})
_SPLIT_ALIASES = {"train": "train", "eval": "eval", "val": "eval", "validation": "eval", "test": "test"}
_PROMPT_RE = re.compile(r"What is (\d+) ([+\-*]) (\d+)\?", re.IGNORECASE)
_COMPARE_RE = re.compile(r"Which is (larger|smaller): (\d+) or (\d+)\?", re.IGNORECASE)
_BOXED_RE = re.compile(r"\\boxed\{([^{}]*)\}")


@dataclass(frozen=True)
class ArithmeticProblem:
    """``a <symbol> b`` with its answer."""

    a: int
    symbol: str
    b: int
    answer: int

    @property
    def prompt(self) -> str:
        if self.symbol in _WORDS:
            return f"Which is {_WORDS[self.symbol]}: {self.a} or {self.b}?"
        return f"What is {self.a} {self.symbol} {self.b}?"

    @property
    def key(self) -> str:
        """The canonical key: equal for a problem and its commuted / operand-swapped twins (see module doc)."""
        return problem_key(self)

    @property
    def split(self) -> str:
        """The split this problem belongs to, from a hash of its canonical key (independent of every setting)."""
        return split_of(self)


def problem_key(problem: ArithmeticProblem) -> str:
    """``"+:7,12"`` for 12 + 7 and 7 + 12; ``"-:12,7"`` for 12 - 7; ``"cmp:3,7"`` for either comparison of 3, 7."""
    a, b = problem.a, problem.b
    if problem.symbol in _COMMUTATIVE:
        a, b = min(a, b), max(a, b)
    kind = "cmp" if problem.symbol in _WORDS else problem.symbol
    return f"{kind}:{a},{b}"


def _split_key(problem: ArithmeticProblem) -> str:
    """What the split hash reads (a module-level seam, so a test can make it leaky and watch the check fail)."""
    return problem_key(problem)


def split_of(problem: ArithmeticProblem) -> str:
    """ "train" (80%), "eval" (10%) or "test" (10%), from a hash of the problem's split key."""
    digest = hashlib.sha256(_split_key(problem).encode()).digest()
    bucket = int.from_bytes(digest[:4], "big") % 10
    return "eval" if bucket == 0 else "test" if bucket == 1 else "train"


def _split_name(split: str) -> str:
    if split not in _SPLIT_ALIASES:
        raise DataError(f"unknown synthetic split {split!r}; use one of {sorted(_SPLIT_ALIASES)}")
    return _SPLIT_ALIASES[split]


def arithmetic_problems(
    split: str = "train", *, max_operand: int = 20, ops: str = "add,sub"
) -> list[ArithmeticProblem]:
    """Every problem of ``split`` with operands in ``[0, max_operand]`` (subtraction: ``a >= b``), sorted."""
    split = _split_name(split)
    names = [name.strip() for name in ops.split(",") if name.strip()]
    unknown = sorted(set(names) - set(_OPS))
    if unknown or not names:
        raise DataError(f"unknown arithmetic ops {unknown or ops!r}; use a comma-separated subset of {sorted(_OPS)}")
    if max_operand < 1:
        raise DataError(f"max_operand must be at least 1, got {max_operand}")
    problems = []
    for name in names:
        symbol, fn = _OPS[name]
        for a in range(max_operand + 1):
            for b in range(max_operand + 1):
                if name == "sub" and a < b:
                    continue  # keep answers non-negative: easier for tiny models
                if name in _WORDS and a == b:
                    continue  # "the larger of 7 and 7" has no single right operand to pick
                problem = ArithmeticProblem(a, symbol, b, fn(a, b))
                if problem.split == split:
                    problems.append(problem)
    if not problems:
        raise DataError(f"no arithmetic problems fall in split {split!r} with max_operand={max_operand}; raise it")
    return problems


def _draw(
    n: int, seed: int, kind: str, split: str, max_operand: int, ops: str
) -> tuple[list[ArithmeticProblem], random.Random]:
    """``n`` problems: whole shuffled passes over the split's pool, so repeats only happen once it is used up."""
    if n < 1:
        raise DataError(f"n must be at least 1, got {n}")
    pool = arithmetic_problems(split, max_operand=max_operand, ops=ops)
    # A string seed is hashed with SHA-512 by random.seed: stable across processes and PYTHONHASHSEED.
    rng = random.Random(f"{kind}:{seed}:{_split_name(split)}")
    drawn: list[ArithmeticProblem] = []
    while len(drawn) < n:
        epoch = list(pool)
        rng.shuffle(epoch)
        drawn.extend(epoch[: n - len(drawn)])
    return drawn, rng


def _answer_text(value: int | str) -> str:
    return f"The answer is \\boxed{{{value}}}."


def _check_show_work(show_work: int, ops: str) -> bool:
    """Whether to write worked solutions; they exist for two-digit addition only."""
    if show_work not in (0, 1):
        raise DataError(f"show_work must be 0 or 1, got {show_work}")
    if show_work and {name.strip() for name in ops.split(",") if name.strip()} != {"add"}:
        raise DataError(f"show_work=1 writes column-addition steps and needs ops=add, got ops={ops!r}")
    return bool(show_work)


def arithmetic_sft(
    n: int,
    seed: int = 0,
    *,
    split: str = "train",
    max_operand: int = 20,
    ops: str = "add,sub",
    boxed_percent: int = 100,
    show_work: int = 0,
    carry_slip_percent: int = 0,
) -> list[dict[str, str]]:
    """SFT rows ``{"prompt": "What is 12 + 7?", "response": "The answer is \\\\boxed{19}."}``.

    With ``boxed_percent`` < 100, that share of responses states the answer without ``\\boxed{}`` ("The answer
    is 19."). With ``show_work=1`` (addition only) the response first works the sum out column by column
    (``"2 + 7 = 9. 1 + 0 = 1. The answer is \\\\boxed{19}."``, see ``roll.pipelines.data._work``).
    With ``carry_slip_percent`` > 0 (worked solutions only), that share of the problems whose units column carries
    is demonstrated with the carry forgotten (a wrong answer, 10 too small): a teacher with a common bad habit,
    for warm-ups whose policy should sample both the right procedure and the wrong one.
    """
    for name, value in (("boxed_percent", boxed_percent), ("carry_slip_percent", carry_slip_percent)):
        if not 0 <= value <= 100:
            raise DataError(f"{name} must be within 0..100, got {value}")
    work = _check_show_work(show_work, ops)
    if carry_slip_percent and not work:
        raise DataError("carry_slip_percent needs worked solutions (show_work=1): a bare answer has no carry step")
    problems, rng = _draw(n, seed, "sft", split, max_operand, ops)
    rows = []
    for p in problems:
        boxed = boxed_percent == 100 or rng.random() * 100 < boxed_percent
        response = _answer_text(p.answer) if boxed else f"The answer is {p.answer}."
        if work:
            carries = p.a % 10 + p.b % 10 >= 10
            forget = carries and carry_slip_percent > 0 and rng.random() * 100 < carry_slip_percent
            steps = column_addition(p.a, p.b, forget_carry=forget)[0]
            response = steps if boxed else steps.replace(f"\\boxed{{{p.answer}}}", str(p.answer))
        rows.append({"prompt": p.prompt, "response": response})
    return rows


def arithmetic_prompts(
    n: int, seed: int = 0, *, split: str = "train", max_operand: int = 20, ops: str = "add,sub"
) -> list[dict[str, str]]:
    """RL rows ``{"prompt": "What is 12 + 7?", "ground_truth": "19", "tag": "math"}``."""
    problems, _ = _draw(n, seed, "prompts", split, max_operand, ops)
    return [{"prompt": p.prompt, "ground_truth": str(p.answer), "tag": "math"} for p in problems]


def preference_pairs(
    n: int, seed: int = 0, *, split: str = "train", max_operand: int = 20, ops: str = "add,sub", show_work: int = 0
) -> list[dict[str, str]]:
    """Preference rows ``{"prompt", "chosen", "rejected"}`` that differ in content, never in format alone.

    The rule, checkable with :func:`is_correct_arithmetic`: both responses box an answer in the same words;
    ``chosen``'s is correct, ``rejected``'s is wrong (for comparisons the other operand, else off by 1-3). With
    ``show_work=1`` both are worked solutions; the rejected one slips in the units column and carries the slip on.
    """
    work = _check_show_work(show_work, ops)
    problems, rng = _draw(n, seed, "preference", split, max_operand, ops)
    rows = []
    for p in problems:
        if work:
            slips = [slip for slip in (-2, -1, 1, 2) if column_addition(p.a, p.b, units_slip=slip)[1] != p.answer]
            rejected = column_addition(p.a, p.b, units_slip=rng.choice(slips))[0]
            rows.append({"prompt": p.prompt, "chosen": column_addition(p.a, p.b)[0], "rejected": rejected})
            continue
        # A wrong answer: for comparisons the other operand (the natural mistake), else off by 1-3.
        wrong = p.a + p.b - p.answer if p.symbol in _WORDS else p.answer + rng.choice([-3, -2, -1, 1, 2, 3])
        rows.append({"prompt": p.prompt, "chosen": _answer_text(p.answer), "rejected": _answer_text(wrong)})
    return rows


def parse_arithmetic(prompt: str) -> ArithmeticProblem | None:
    """The synthetic problem a prompt asks, or None if ``prompt`` is not one."""
    compare = _COMPARE_RE.search(prompt)
    if compare is not None:
        a, b = int(compare.group(2)), int(compare.group(3))
        name = "max" if compare.group(1).lower() == "larger" else "min"
        return ArithmeticProblem(a, name, b, _OPS[name][1](a, b))
    match = _PROMPT_RE.search(prompt)
    if match is None:
        return None
    a, symbol, b = int(match.group(1)), match.group(2), int(match.group(3))
    return ArithmeticProblem(a, symbol, b, next(fn(a, b) for sym, fn in _OPS.values() if sym == symbol))


def solve_arithmetic(prompt: str) -> int | None:
    """The answer to a synthetic prompt, or None if ``prompt`` is not one."""
    problem = parse_arithmetic(prompt)
    return None if problem is None else problem.answer


def prompt_key(prompt: str) -> str:
    """The canonical key of a synthetic prompt; any other prompt is keyed by its normalised text (duplicates)."""
    problem = parse_arithmetic(prompt)
    return problem_key(problem) if problem is not None else "text:" + " ".join(prompt.lower().split())


def split_leaks(train_prompts: Iterable[str], eval_prompts: Iterable[str]) -> dict[str, tuple[str, str]]:
    """Problems asked in both sets (same canonical key): key -> (a train prompt, an eval prompt). Empty = no leak."""
    seen = {prompt_key(p): p for p in train_prompts}
    leaks: dict[str, tuple[str, str]] = {}
    for prompt in eval_prompts:
        key = prompt_key(prompt)
        if key in seen and key not in leaks:
            leaks[key] = (seen[key], prompt)
    return leaks


def extract_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` in ``text``, stripped, or None."""
    found = _BOXED_RE.findall(text)
    return found[-1].strip() if found else None


def is_correct_arithmetic(prompt: str, response: str) -> bool:
    """Whether ``response`` boxes the correct answer to the synthetic ``prompt``."""
    answer, boxed = solve_arithmetic(prompt), extract_boxed(response)
    return answer is not None and boxed is not None and boxed == str(answer)


SYNTHETIC_GENERATORS: dict[str, Callable[..., list[dict[str, Any]]]] = {
    "arithmetic_sft": arithmetic_sft,
    "arithmetic_prompts": arithmetic_prompts,
    "preference_pairs": preference_pairs,
}
_INT_PARAMS = ("n", "seed", "max_operand", "boxed_percent", "show_work", "carry_slip_percent")
_PARAM_DEFAULTS: dict[str, Any] = {"n": 1000, "seed": 0, "max_operand": 20, "ops": "add,sub"}
# Parameters only some generators take.
_EXTRA_PARAMS: dict[str, dict[str, Any]] = {
    "arithmetic_sft": {"boxed_percent": 100, "show_work": 0, "carry_slip_percent": 0},
    "preference_pairs": {"show_work": 0},
}


def _parse_uri(uri: str, default_split: str) -> tuple[str, dict[str, Any]]:
    parts = urlsplit(uri)
    name = parts.netloc or parts.path.lstrip("/")
    if parts.scheme != "synthetic" or name not in SYNTHETIC_GENERATORS:
        raise DataError(
            f"{uri!r} is not a known synthetic dataset; use synthetic://NAME?n=...&seed=...&split=... with NAME one "
            f"of {sorted(SYNTHETIC_GENERATORS)}"
        )
    params: dict[str, Any] = {**_PARAM_DEFAULTS, **_EXTRA_PARAMS.get(name, {}), "split": default_split}
    seen: set[str] = set()
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if key not in params:
            raise DataError(f"{uri!r}: unknown parameter {key!r}; allowed: {sorted(params)}")
        if key in seen:
            raise DataError(f"{uri!r}: parameter {key!r} is given twice; give it once")
        seen.add(key)
        if key in _INT_PARAMS:
            try:
                params[key] = int(value)
            except ValueError:
                raise DataError(f"{uri!r}: parameter {key!r} must be an integer, got {value!r}") from None
        else:
            params[key] = value
    params["split"] = _split_name(params["split"])
    return name, params


def resolve_data_uri(uri: str, cache_dir: str | Path, *, default_split: str = "train") -> Path:
    """Generate the dataset a ``synthetic://`` URI names as a jsonl file in ``cache_dir`` and return its path.

    ``synthetic://arithmetic_sft?n=2000&seed=0&split=train`` (parameters: ``n``, ``seed``, ``split``,
    ``max_operand``, ``ops``; ``split`` defaults to ``default_split``). The file name is derived from the
    generator, its version and every parameter, so resolving the same URI again returns the existing file, and
    the file is written to a temporary name and renamed, so a reader never sees a partial file.
    """
    name, params = _parse_uri(uri, default_split)
    canonical = json.dumps({"name": name, "version": _GENERATOR_VERSION, **params}, sort_keys=True)
    digest = hashlib.sha256(canonical.encode()).hexdigest()[:12]
    cache = Path(cache_dir).expanduser()
    path = cache / f"{name}-{params['split']}-n{params['n']}-seed{params['seed']}-{digest}.jsonl"
    if path.exists():
        return path
    extra = {key: params[key] for key in _EXTRA_PARAMS.get(name, {})}
    rows = SYNTHETIC_GENERATORS[name](
        params["n"],
        params["seed"],
        split=params["split"],
        max_operand=params["max_operand"],
        ops=params["ops"],
        **extra,
    )
    cache.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=cache, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
