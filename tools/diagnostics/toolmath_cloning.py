"""Can the recipe's model learn the tool-use episode by behaviour cloning: copy the question into a python_code call,
then copy the tool's printed result into ``<answer>``? From how many episodes, and behind which prompt?

Usage: python -m tools.diagnostics.toolmath_cloning [--preset micro] [--steps 300] [--batch 32] [--lr 1e-3]
       [--noise 0.4] [--prompt full|no-instruction|question] [--eval-every 50] [--eval-questions 128] [--seed 0] [--threads 2]

A plain torch loop (no Ray, no pipeline). Each sample is one whole episode of ``ToolMathExpert`` on a training
question of ``agentic-tool-use-tiny``'s env (3-digit products), laid out token for token as the trajectory-wise
manager lays it out (``ChatFormatter``: the opening user message, the assistant's tool call, the tool's message, the
assistant's answer; loss on assistant tokens). The tool's result is computed here (the same text python_code prints),
so no sandbox runs. ``--prompt full`` opens with the recipe's former instruction line, the question and the tools'
generated description (what its managers showed before docs/results/agentic.md section 21); ``no-instruction`` leaves
out the instruction line (``show_env_instruction: false``); ``question`` shows the question alone (no instruction
line, and the python tool's ``tool_instruction: ""``). ``--noise``: the demonstrator's share of tool-less answers (the
recipe's 0.4).

Every ``--eval-every`` steps, greedy episodes on held-out (``val`` split) questions, the model's own tool call run
through the same evaluation: the share that call the tool, whose call is exactly ``print(<the question>)``, and
that answer correctly (``val/correct``), plus the share of correct answers among episodes whose call was exact (the
copy from the tool's message alone).
"""

from __future__ import annotations

import argparse
import random
import re
import time

import torch

from roll.agentic.env.math_tool import make_tool_math_env
from roll.agentic.env.parsing import parse_action
from roll.agentic.env_manager.chat import ChatFormatter
from roll.agentic.policy.expert import ToolMathExpert
from roll.agentic.tools.parsing import parse_tool_calls
from tools.diagnostics.cloning import tiny_model, update

# the recipe's former instruction line
RECIPE_INSTRUCTION = "Answer with the integer result in <answer>...</answer>. You may call python_code first."
_PRINT = re.compile(r"^print\(\s*(\d+)\s*\*\s*(\d+)\s*\)$")


def opening(question_seed: int, split: str, prompt_kind: str) -> tuple[str, int, str]:
    """(first user message, the right answer, the question's expression) for ``prompt_kind``."""
    env = make_tool_math_env(digits=3, num_operands=2, operators="*", max_steps=3, split=split)
    observation, info = env.reset(question_seed)
    question = observation.split("\n", 1)[0]
    expr = question.removeprefix("What is ").removesuffix("?")
    text = {"full": f"{RECIPE_INSTRUCTION}\n{observation}", "no-instruction": observation, "question": question}
    return text[prompt_kind], int(info["answer"]), expr


def tool_message(code: str) -> str | None:
    """What python_code answers for ``print(a * b)`` (None for any other program: counted as a failed call)."""
    match = _PRINT.match(code.strip())
    return f"python_code result:\n{int(match[1]) * int(match[2])}\n" if match else None


def episode_ids(
    formatter: ChatFormatter, user: str, responses: list[str], tool_outputs: list[str]
) -> tuple[list[int], list[int]]:
    """Token ids and loss mask of an episode: ``responses`` (assistant) with ``tool_outputs`` between them."""
    ids = formatter.first_turn([{"role": "user", "content": user}])
    mask = [0] * len(ids)
    previous: list[int] = []
    for i, response in enumerate(responses):
        if i > 0:
            between = formatter.next_turn([{"role": "tool", "content": tool_outputs[i - 1]}], previous)
            ids += between
            mask += [0] * len(between)
        previous = [*formatter.encode(response), formatter.eos_token_id]
        ids += previous
        mask += [1] * len(previous)
    return ids, mask


def demonstration(formatter: ChatFormatter, expert: ToolMathExpert, rng: random.Random, prompt_kind: str):
    user, _, expr = opening(rng.randrange(1 << 30), "train", prompt_kind)
    first = expert(f"What is {expr}?", rng)
    if "<tool_call>" not in first:
        return episode_ids(formatter, user, [first], [])
    code = parse_tool_calls(first).calls[0].arguments["code"]
    output = tool_message(code) or ""
    second = expert(f"What is {expr}?<|im_start|>tool\n{output}<|im_end|>", rng)
    return episode_ids(formatter, user, [first, second], [output])


@torch.no_grad()
def generate(model, formatter: ChatFormatter, ids: list[int], max_new_tokens: int = 96) -> list[int]:
    out = model.generate(
        torch.tensor([ids]),
        attention_mask=torch.ones(1, len(ids), dtype=torch.long),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=formatter.eos_token_id,
        pad_token_id=formatter.eos_token_id,
    )
    return out[0, len(ids) :].tolist()


def evaluate(model, formatter: ChatFormatter, questions: list[int], prompt_kind: str) -> dict[str, float]:
    calls = exact = correct = correct_after_exact = 0
    for seed in questions:
        user, answer, expr = opening(seed, "val", prompt_kind)
        context = formatter.first_turn([{"role": "user", "content": user}])
        response = generate(model, formatter, context)
        text = formatter.decode(response)
        parsed = parse_tool_calls(text)
        if parsed.present and parsed.calls:
            calls += 1
            code = str(parsed.calls[0].arguments.get("code", ""))
            was_exact = code.strip() == f"print({expr})"
            exact += was_exact
            output = tool_message(code) or "python_code failed: Error"
            context += response + formatter.next_turn([{"role": "tool", "content": output}], response)
            response = generate(model, formatter, context)
            text = formatter.decode(response)
        else:
            was_exact = False
        action = parse_action(text)
        content = action.content.replace(",", "").strip()
        right = action.valid and content.lstrip("-").isdigit() and int(content) == answer
        correct += right
        correct_after_exact += right and was_exact
    n = len(questions)
    return {
        "calls": calls / n,
        "exact_call": exact / n,
        "correct": correct / n,
        "correct_if_exact": correct_after_exact / exact if exact else 0.0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="micro")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--noise", type=float, default=0.4)
    parser.add_argument("--prompt", default="full", choices=["full", "no-instruction", "question"])
    parser.add_argument("--eval-every", type=int, default=50)
    parser.add_argument("--eval-questions", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    tokenizer, model = tiny_model(args.preset, args.seed)
    formatter = ChatFormatter(tokenizer)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    expert, rng = ToolMathExpert(noise=args.noise), random.Random(1)
    questions = [7_000_003 + i for i in range(args.eval_questions)]
    print(f"prompt={args.prompt} noise={args.noise} lr={args.lr} batch={args.batch} seed={args.seed}", flush=True)
    started = time.perf_counter()
    for step in range(1, args.steps + 1):
        rows = [demonstration(formatter, expert, rng, args.prompt) for _ in range(args.batch)]
        loss = update(model, optimizer, tokenizer.pad_token_id, rows)
        if step % args.eval_every == 0:
            model.eval()
            result = evaluate(model, formatter, questions, args.prompt)
            elapsed = time.perf_counter() - started
            shown = " ".join(f"{k} {v:.3f}" for k, v in result.items())
            print(
                f"  step {step} ({step * args.batch} episodes, {elapsed:.0f} s): loss {loss:.3f} {shown}",
                flush=True,
            )


if __name__ == "__main__":
    main()
