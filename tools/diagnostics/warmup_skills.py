"""What the quick start's warm-up can do before RL: sampled accuracy on held-out sums with and without a units carry.

rlvr-tiny's GRPO has something to learn only if its start knows the one-digit facts (sums without a carry come out
right) while some of its samples carry and most greedy answers do not (docs/results/quickstart.md). This samples
the start on held-out problems and reports both shares, plus greedy accuracy, so a start that drifted (a new
dependency set, a changed recipe) is seen before a learning run is blamed.

Usage: python -m tools.diagnostics.warmup_skills MODEL_DIR EVAL_JSONL [PROMPTS] [SAMPLES]
  MODEL_DIR: an HF folder (e.g. ``$ROLL_CACHE_DIR/recipes/rlvr-tiny-warmup-*/hf_export``); EVAL_JSONL: rlvr-tiny's
  held-out prompts (``$ROLL_CACHE_DIR/data/arithmetic_prompts-eval-*.jsonl``); PROMPTS: how many of them (default
  96); SAMPLES: samples per prompt at temperature 1 (default 8). Answers are graded by their last ``\\boxed{}``
  (the math reward's extraction).
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from roll.pipelines.rewards.math import extract_boxed

MAX_NEW_TOKENS = 40


def carries(prompt: str) -> bool:
    a, b = (int(x) for x in re.findall(r"\d+", prompt)[:2])
    return a % 10 + b % 10 >= 10


def main(model_dir: str, eval_file: str, prompts: int = 96, samples: int = 8) -> dict[str, float]:
    torch.manual_seed(0)
    tokenizer: Any = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with open(eval_file) as lines:
        rows = [json.loads(line) for line in lines][:prompts]
    counts: Counter[str] = Counter()
    pad = tokenizer.pad_token_id or 0
    for row in rows:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": row["prompt"]}], tokenize=False, add_generation_prompt=True
        )
        ids = tokenizer(text, return_tensors="pt").input_ids
        kind = "carry" if carries(row["prompt"]) else "no_carry"
        with torch.no_grad():
            sampled = model.generate(
                ids,
                do_sample=True,
                temperature=1.0,
                max_new_tokens=MAX_NEW_TOKENS,
                num_return_sequences=samples,
                pad_token_id=pad,
            )
            greedy = model.generate(ids, do_sample=False, max_new_tokens=MAX_NEW_TOKENS, pad_token_id=pad)
        truth = str(row["ground_truth"])
        answers = [extract_boxed(tokenizer.decode(s[ids.shape[1] :], skip_special_tokens=True)) for s in sampled]
        counts[f"{kind}/right"] += sum(a == truth for a in answers)
        counts[f"{kind}/samples"] += samples
        counts[f"{kind}/greedy_right"] += extract_boxed(tokenizer.decode(greedy[0][ids.shape[1] :])) == truth
        counts[f"{kind}/prompts"] += 1
    report = {}
    for kind in ("no_carry", "carry"):
        report[f"{kind}/prompts"] = float(counts[f"{kind}/prompts"])
        report[f"{kind}/sampled_correct"] = counts[f"{kind}/right"] / max(1, counts[f"{kind}/samples"])
        report[f"{kind}/greedy_correct"] = counts[f"{kind}/greedy_right"] / max(1, counts[f"{kind}/prompts"])
    return report


if __name__ == "__main__":
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    extra = [int(v) for v in sys.argv[3:5]]
    for key, value in main(sys.argv[1], sys.argv[2], *extra).items():
        print(f"{key:28s} {value:.3f}")
