"""``model_args.freeze_module_prefix``: train only part of a model (ROLL's partial-parameter fine-tuning).

ROLL's rule (``roll/models/model_providers.py:freeze_model``): a parameter is frozen when its name in
``model.named_parameters()`` starts with one of the prefixes (a plain string prefix, so ``model.layers.1`` also
matches ``model.layers.10``), with the HF model's names (``model.embed_tokens.weight``, ``lm_head.weight``...) on
HF/FSDP backends. Frozen parameters get ``requires_grad=False`` before the optimizer is built, so they are
neither updated nor held in optimizer state. Unlike ROLL, a prefix that matches no parameter is an error (ROLL
freezes nothing and says nothing), and so is a list that freezes every parameter.
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Iterable, Sequence

from torch import nn

from roll.runtime import ConfigError

__all__ = ["freeze_by_prefix", "nearby_names", "unmatched_prefix_error"]

logger = logging.getLogger(__name__)


def _prefixes_of(names: Iterable[str]) -> set[str]:
    """Every dotted prefix of every name (the module names a prefix may spell), and the names themselves."""
    out: set[str] = set()
    for name in names:
        parts = name.split(".")
        out.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return out


def nearby_names(prefix: str, names: Iterable[str], limit: int = 6) -> list[str]:
    """Module/parameter names close to ``prefix`` (by spelling), else the model's top-level modules."""
    candidates = _prefixes_of(names)
    close = difflib.get_close_matches(prefix, sorted(candidates), n=limit, cutoff=0.5)
    if close:
        return close
    return sorted({name.split(".")[0] for name in names})[:limit]


def unmatched_prefix_error(prefix: str, names: Sequence[str], *, form: str, hint: str = "") -> ConfigError:
    """One clear error for a prefix that matches no parameter name of the given ``form``."""
    nearby = ", ".join(nearby_names(prefix, names))
    return ConfigError(
        f"model_args.freeze_module_prefix: {prefix!r} matches no parameter ({form} names, prefix match as in "
        f"ROLL); nearby module names: {nearby}.{(' ' + hint) if hint else ''} Fix or remove the prefix"
    )


def freeze_by_prefix(model: nn.Module, prefixes: Sequence[str]) -> list[str]:
    """Set ``requires_grad=False`` on every parameter whose ``named_parameters()`` name starts with a prefix.

    Returns the frozen names. Raises ConfigError naming a prefix that matches nothing (with nearby module names)
    or when nothing would be left to train.
    """
    named = list(model.named_parameters())
    names = [name for name, _ in named]
    for prefix in prefixes:
        if not any(name.startswith(prefix) for name in names):
            shared = [n for n, _ in model.named_parameters(remove_duplicate=False) if n.startswith(prefix)]
            hint = (
                f"{shared[0]!r} is tied to (shares the tensor of) another parameter, which named_parameters lists "
                "instead; freeze that one"
                if shared
                else ""
            )
            raise unmatched_prefix_error(prefix, names, form="HF model", hint=hint)
    frozen = [name for name in names if any(name.startswith(prefix) for prefix in prefixes)]
    trainable = [name for name, param in named if param.requires_grad and name not in frozen]
    if not trainable:
        raise ConfigError(
            f"model_args.freeze_module_prefix={list(prefixes)} freezes every trainable parameter; leave some "
            "modules out of it"
        )
    by_name = dict(named)
    for name in frozen:
        by_name[name].requires_grad_(False)
    logger.info("froze %d of %d parameters (prefixes %s)", len(frozen), len(names), list(prefixes))
    return frozen
