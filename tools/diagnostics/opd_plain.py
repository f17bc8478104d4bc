"""Pure on-policy distillation on opd-tiny's student and teacher in plain PyTorch + transformers, none of roll's
training code: a reference for roll's OPD path and a cheap way to see how the recipe's settings behave
(docs/results/distill.md).

Usage: python -m tools.diagnostics.opd_plain LR STEPS [--samples N] [--prompts P] [--fixed] [--warmup W]
  [--eval-every K]
  Models: the cached exports of recipe://distill-tiny?distill_loss_weight=0.0&max_steps=100 (student) and
  recipe://distill-tiny?distill_loss_weight=0.0 (teacher) under ROLL_CACHE_DIR.
Each step: P training prompts x N samples (temperature 1, 40 new tokens) from the student; per-token advantage
-(log p_student - log p_teacher) on the sampled tokens; one Adam step on -token_mean(A * log p) (grad clip 1).
Prints the sampled reverse-KL estimate (k1, what opd/reverse_kl logs), the exact reverse KL over the vocabulary at
the sampled positions before and after the step (same batch), and every K steps greedy correctness (any format) on
128 training-split prompts the run never samples (the last ones of the split): settings are chosen on these, never
on the recipe's held-out eval split. ``--fixed``: the same prompts every step (a fixed prompt set; fresh samples).
``--warmup W``: the learning rate rises linearly over the first W steps (lr * step / W), then stays.
"""

from __future__ import annotations

import argparse
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from roll.pipelines.data.synthetic import arithmetic_prompts
from roll.pipelines.evaluation import grade_answer
from roll.pipelines.launcher import run_cached_recipe


def _chat(tok: Any, rows: list[dict[str, str]]) -> list[str]:
    return [
        tok.apply_chat_template([{"role": "user", "content": r["prompt"]}], tokenize=False, add_generation_prompt=True)
        for r in rows
    ]


def _response_mask(resp: torch.Tensor, eos: int, pad: int) -> torch.Tensor:
    """1 up to and including the first eos/pad of each row (the stop token is trained), 0 after it."""
    stop = (resp == eos) | (resp == pad)
    after = (stop.int().cumsum(1) - stop.int()) > 0
    return (~after).float()


def _log_softmax(model: Any, ids: torch.Tensor, att: torch.Tensor, start: int) -> torch.Tensor:
    """(B, R, V) log-probs predicting the response tokens (positions start-1 .. -2)."""
    pos = (att.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=att, position_ids=pos).logits[:, start - 1 : -1]
    return torch.log_softmax(logits.float(), -1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("lr", type=float)
    parser.add_argument("steps", type=int)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--fixed", action="store_true")
    parser.add_argument("--warmup", type=int, default=0)
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--eval-n", type=int, default=128)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    # opd-tiny's student and teacher (trained once into roll's cache if absent)
    student_path = str(run_cached_recipe("distill-tiny", ["distill_loss_weight=0.0", "max_steps=100"]))
    teacher_path = str(run_cached_recipe("distill-tiny", ["distill_loss_weight=0.0"]))
    tok = AutoTokenizer.from_pretrained(student_path)
    tok.padding_side = "left"
    student: Any = AutoModelForCausalLM.from_pretrained(student_path, dtype=torch.float32)
    teacher = AutoModelForCausalLM.from_pretrained(teacher_path, dtype=torch.float32).eval()
    train = arithmetic_prompts(4000, 2, split="train", max_operand=99, ops="add")
    unseen = train[-args.eval_n :]  # never sampled: steps * prompts < len(train) - eval_n is checked below
    if args.steps * args.prompts > len(train) - args.eval_n:
        raise SystemExit("steps * prompts reaches the unseen evaluation prompts; use fewer")

    @torch.no_grad()
    def evaluate(model: Any) -> tuple[float, float]:
        model.eval()
        b = tok(_chat(tok, unseen), return_tensors="pt", padding=True)
        out = model.generate(**b, max_new_tokens=40, do_sample=False, pad_token_id=tok.pad_token_id)
        texts = tok.batch_decode(out[:, b["input_ids"].shape[1] :], skip_special_tokens=True)
        grades = [grade_answer(t, r["ground_truth"]) for t, r in zip(texts, unseen)]
        return sum(g.correct for g in grades) / len(grades), sum(bool(g.formatted) for g in grades) / len(grades)

    print(f"teacher unseen-prompt correct/format {evaluate(teacher)}", flush=True)
    print(f"step 0 unseen-prompt correct/format {evaluate(student)}", flush=True)
    opt = torch.optim.Adam(student.parameters(), lr=args.lr)
    n = args.samples
    for step in range(1, args.steps + 1):
        first = 0 if args.fixed else (step - 1) * args.prompts
        rows = train[first : first + args.prompts]
        b = tok(_chat(tok, rows), return_tensors="pt", padding=True)
        student.eval()
        with torch.no_grad():
            out = student.generate(
                **b,
                max_new_tokens=40,
                do_sample=True,
                temperature=1.0,
                top_p=1.0,
                top_k=0,
                num_return_sequences=n,
                pad_token_id=tok.pad_token_id,
            )
        start = b["input_ids"].shape[1]
        resp = out[:, start:]
        mask = _response_mask(resp, tok.eos_token_id, tok.pad_token_id)
        ids = out
        att = torch.cat([b["attention_mask"].repeat_interleave(n, 0), mask.long()], 1)
        with torch.no_grad():
            t_full = _log_softmax(teacher, ids, att, start)
        t_lp = t_full.gather(-1, resp.unsqueeze(-1)).squeeze(-1)
        student.train()
        s_full = _log_softmax(student, ids, att, start)
        s_lp = s_full.gather(-1, resp.unsqueeze(-1)).squeeze(-1)
        adv = -(s_lp.detach() - t_lp) * mask
        tokens = mask.sum()
        k1 = float(((s_lp.detach() - t_lp) * mask).sum() / tokens)
        exact_before = float(((s_full.exp() * (s_full - t_full)).sum(-1).detach() * mask).sum() / tokens)
        loss = -(adv * s_lp * mask).sum() / tokens
        for group in opt.param_groups:
            group["lr"] = args.lr * min(1.0, step / args.warmup) if args.warmup else args.lr
        opt.zero_grad()
        loss.backward()
        grad_norm = float(torch.nn.utils.clip_grad_norm_(student.parameters(), 1.0))
        opt.step()
        with torch.no_grad():
            s_after = _log_softmax(student, ids, att, start)
        exact_after = float(((s_after.exp() * (s_after - t_full)).sum(-1) * mask).sum() / tokens)
        print(
            f"step {step} k1 {k1:.3f} exact_rkl {exact_before:.3f} -> {exact_after:.3f} "
            f"grad_norm {grad_norm:.2f} len {float(mask.sum(1).mean()):.1f}",
            flush=True,
        )
        if step % args.eval_every == 0:
            print(f"step {step} unseen-prompt correct/format {evaluate(student)}", flush=True)


if __name__ == "__main__":
    main()
