"""Which teacher scores which rows in on-policy distillation with several teachers (ROLL's multi-teacher OPD).

ROLL's routing (``roll/utils/functionals.py``: ``build_domain_to_teacher_names``, ``compute_ref_log_probs_with_routing``;
``roll/configs/base_config.py``: ``_handle_opd_mapping``): a row belongs to a reward domain (by its ``tag``), the
domain has tags (its ``tag_included``), and the row goes to every teacher whose ``tag_included`` shares a tag with
the domain's, plus every teacher with an empty ``tag_included``. Each teacher's log-probs are computed on its rows
only; the OPD terms of a row's teachers add up (``roll.pipelines.rlvr.opd.apply_opd``).

Where ROLL silently leaves a row without a teacher (zero KL), roll says so: a teacher tag that no reward domain has
is a config error, and so is, in pure OPD, a reward domain routed to no teacher (its rows would get no advantage at
all). In mixed OPD (``use_opd``) such rows keep their reward-based advantage, as in ROLL.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

from roll.runtime import ConfigError

__all__ = ["TeacherRouter", "check_teacher_routing", "scatter_rows", "teachers_by_domain"]


def teachers_by_domain(
    domain_tags: Mapping[str, Sequence[str]], teacher_tags: Mapping[str, Sequence[str]]
) -> dict[str, list[str]]:
    """Reward domain -> the teachers scoring its rows, in the teachers' order (ROLL's domain -> teacher names)."""
    return {
        domain: [name for name, own in teacher_tags.items() if not own or set(own) & set(tags)]
        for domain, tags in domain_tags.items()
    }


def _describe(tags: Mapping[str, Sequence[str]]) -> str:
    return ", ".join(f"{name}: {list(own) or '(every row)'}" for name, own in tags.items())


def check_teacher_routing(
    domain_tags: Mapping[str, Sequence[str]],
    teacher_tags: Mapping[str, Sequence[str]],
    *,
    pure: bool,
    unit: str = "reward domain",
    trained: Iterable[str] | None = None,
) -> None:
    """Errors for teacher tags no domain has and, in pure OPD, for ``trained`` domains (default: all) no teacher
    covers. ``unit`` names a domain in the messages (RLVR's reward domains, the agentic pipeline's env tags)."""
    known = {tag for tags in domain_tags.values() for tag in tags}
    tags_are_domains = all(list(tags) == [domain] for domain, tags in domain_tags.items())  # env tags
    listed = ", ".join(domain_tags) if tags_are_domains else _describe(domain_tags)
    for name, own in teacher_tags.items():
        unknown = sorted(set(own) - known)
        if unknown:
            raise ValueError(
                f"teacher {name!r}: tag_included names {unknown}, which match no {unit} ({unit}s: {listed}); fix "
                f"the tag or add it to a {unit}"
            )
    if not pure:
        return
    needed = set(domain_tags) if trained is None else set(trained)
    routed = teachers_by_domain(domain_tags, teacher_tags)
    uncovered = [domain for domain, names in routed.items() if domain in needed and not names]
    if uncovered:
        shown = "" if tags_are_domains else f" (tags {[list(domain_tags[d]) for d in uncovered]})"
        raise ValueError(
            f"is_pure_opd: {'training ' if trained is not None else ''}{unit}(s) {uncovered}{shown} are routed to "
            f"no teacher (teachers' tag_included: {_describe(teacher_tags)}), so their samples would get no "
            f"advantage; add their tags to a teacher's tag_included, or leave one teacher's tag_included empty "
            f"(it then scores every row)"
        )


def scatter_rows(values: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``values`` of the ``rows`` (a (batch,) bool mask) written into zeros of the whole batch."""
    out = torch.zeros((len(rows), *values.shape[1:]), dtype=torch.float32)
    out[rows] = values.float()
    return out


class TeacherRouter:
    """Per-row teacher masks for a batch, from the reward domains' and the teachers' ``tag_included``."""

    def __init__(
        self, domain_tags: Mapping[str, Sequence[str]], teacher_tags: Mapping[str, Sequence[str]], *, pure: bool
    ) -> None:
        self.teacher_tags = {name: list(own) for name, own in teacher_tags.items()}
        self.owner = {tag: domain for domain, tags in domain_tags.items() for tag in tags}
        self.by_domain = teachers_by_domain(domain_tags, teacher_tags)
        self.pure = pure

    def masks(self, column: Iterable[Any]) -> dict[str, torch.Tensor]:
        """Teacher name -> (batch,) bool: the rows (by their ``tag`` column) that teacher scores."""
        tags = list(column)
        out = {name: torch.zeros(len(tags), dtype=torch.bool) for name in self.teacher_tags}
        for i, tag in enumerate(tags):
            domain = self.owner.get(str(tag))
            if domain is None:
                raise ConfigError(f"row {i} has tag {tag!r}, which no reward domain's tag_included has")
            names = self.by_domain[domain]
            if not names and self.pure:
                raise ConfigError(
                    f"row {i} (tag {tag!r}, reward domain {domain!r}) is routed to no teacher (teachers' "
                    f"tag_included: {_describe(self.teacher_tags)})"
                )
            for name in names:
                out[name][i] = True
        return out
