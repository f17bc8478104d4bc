"""GRPO on rlvr-tiny's warm-up model in plain PyTorch + transformers, none of roll's training code: a reference to
tell a bug in roll's RL path from the optimisation itself (docs/results/quickstart.md).

Usage: python -m tools.diagnostics.grpo_plain OPTIMIZER LR STEPS [START_MODEL]
  OPTIMIZER adam|sgd; START_MODEL: an HF folder (default: the cached export of sft-tiny-partial, the quick start's
  warm-up when these numbers were taken; trained once if roll's cache lacks it).
Each step: 16 training prompts x 8 samples (temperature 1), math-rule scores (boxed), GRPO advantages, one
on-policy step of -mean_tokens(A * log p); prints the rollout accuracy and the mean change of the samples' log-probs
for positive and negative advantages, and greedy correctness on 128 held-out prompts every 5 steps.
"""

import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from roll.pipelines.data.synthetic import arithmetic_prompts
from roll.pipelines.launcher import run_cached_recipe
from roll.pipelines.rewards.math import math_score


def main() -> None:
    torch.manual_seed(0)
    torch.set_num_threads(2)
    opt_name, lr, steps = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
    path = sys.argv[4] if len(sys.argv) > 4 else str(run_cached_recipe("sft-tiny-partial"))
    tok = AutoTokenizer.from_pretrained(path)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32)
    train = arithmetic_prompts(8000, 1, split="train", max_operand=99, ops="add")
    evalr = arithmetic_prompts(256, 1, split="eval", max_operand=99, ops="add")[:128]

    def enc(rows):
        return [
            tok.apply_chat_template(
                [{"role": "user", "content": r["prompt"]}], tokenize=False, add_generation_prompt=True
            )
            for r in rows
        ]

    def gen(rows, n, greedy):
        b = tok(enc(rows), return_tensors="pt", padding=True)
        with torch.no_grad():
            out = model.generate(
                **b,
                max_new_tokens=40,
                do_sample=not greedy,
                temperature=1.0,
                top_p=1.0,
                top_k=0,
                num_return_sequences=n,
                pad_token_id=tok.pad_token_id,
            )
        return b, out[:, b["input_ids"].shape[1] :]

    def evaluate():
        model.eval()
        _, resp = gen(evalr, 1, True)
        texts = tok.batch_decode(resp, skip_special_tokens=True)
        return sum(math_score(t, r["ground_truth"], require_boxed=True)[0] for t, r in zip(texts, evalr)) / len(evalr)

    opt = (
        torch.optim.Adam(model.parameters(), lr=lr)
        if opt_name == "adam"
        else torch.optim.SGD(model.parameters(), lr=lr)
    )
    print("step 0 val", evaluate(), flush=True)
    for step in range(1, steps + 1):
        rows = train[(step - 1) * 16 : step * 16]
        model.eval()
        b, resp = gen(rows, 8, False)
        texts = tok.batch_decode(resp, skip_special_tokens=True)
        scores = torch.tensor(
            [math_score(t, rows[i // 8]["ground_truth"], require_boxed=True)[0] for i, t in enumerate(texts)]
        )
        g = scores.view(16, 8)
        adv = ((g - g.mean(1, keepdim=True)) / (g.std(1, keepdim=True) + 1e-6)).view(-1)
        eos = tok.eos_token_id
        mask = torch.ones_like(resp, dtype=torch.float)
        for r in range(resp.shape[0]):  # tokens after the first eos/pad are padding
            ids = resp[r].tolist()
            for j, t in enumerate(ids):
                if t in (eos, tok.pad_token_id):
                    mask[r, j + 1 :] = 0
                    break
        prompt_ids = b["input_ids"].repeat_interleave(8, 0)
        prompt_mask = b["attention_mask"].repeat_interleave(8, 0)
        ids = torch.cat([prompt_ids, resp], 1)
        att = torch.cat([prompt_mask, mask.long()], 1)
        model.train()
        opt.zero_grad()
        logits = model(input_ids=ids, attention_mask=att).logits[:, prompt_ids.shape[1] - 1 : -1]
        logp = torch.log_softmax(logits.float(), -1).gather(-1, resp.unsqueeze(-1)).squeeze(-1)
        loss = -(adv[:, None] * logp * mask).sum() / mask.sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        with torch.no_grad():
            new = (
                torch.log_softmax(
                    model(input_ids=ids, attention_mask=att).logits[:, prompt_ids.shape[1] - 1 : -1].float(), -1
                )
                .gather(-1, resp.unsqueeze(-1))
                .squeeze(-1)
            )
        d = ((new - logp.detach()) * mask).sum(1) / mask.sum(1)
        pos, neg = adv > 0, adv < 0
        print(
            f"step {step} acc {scores.mean():.3f} dlogp pos {d[pos].mean():+.4f} neg {d[neg].mean():+.4f}", flush=True
        )
        if step % 5 == 0:
            print(f"step {step} val {evaluate():.3f}", flush=True)


if __name__ == "__main__":
    main()
