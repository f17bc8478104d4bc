"""Worked solutions for synthetic addition: column by column, the way it is done on paper.

``47 + 38`` -> ``"7 + 8 = 15. 4 + 3 + 1 = 8. The answer is \\boxed{85}."``: the units column, then the tens
column with the carry, then the answer assembled from the two. Every step is a one-digit fact, so a small model
learns a procedure that carries over to problems it never saw, instead of a table of whole sums; a policy that
knows only some facts makes mistakes in the steps, which a verifier rewarding the final answer can correct.
"""

from __future__ import annotations

__all__ = ["column_addition"]


def column_addition(a: int, b: int, *, units_slip: int = 0, forget_carry: bool = False) -> tuple[str, int]:
    """The worked solution of ``a + b`` (0..99 each) and the answer it reaches.

    ``units_slip`` adds that much to the units column's sum (kept within 0..18) and carries the mistake through:
    a plausible wrong solution, for preference data. ``forget_carry`` leaves the units column's carry out of the
    tens column (``"7 + 8 = 15. 4 + 3 = 7."``, answer 75 for 47 + 38): the classic slip of column addition.
    """
    if not (0 <= a <= 99 and 0 <= b <= 99):
        raise ValueError(f"column_addition handles two-digit operands (0..99), got {a} and {b}")
    units = min(max(a % 10 + b % 10 + units_slip, 0), 18)
    carry = 0 if forget_carry else units // 10
    tens = a // 10 + b // 10 + carry
    answer = tens * 10 + units % 10
    tens_step = f"{a // 10} + {b // 10}" + (" + 1" if carry else "") + f" = {tens}."
    text = f"{a % 10} + {b % 10} = {units}. {tens_step} The answer is \\boxed{{{answer}}}."
    return text, answer
