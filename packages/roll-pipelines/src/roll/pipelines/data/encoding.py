"""Encode rows into token ids for SFT, preference (DPO) and RL prompts, and filter them by length with a report.

Conventions:

* ``labels`` are aligned with ``input_ids``: ``labels[t] == input_ids[t]`` when token ``t`` is a training target
  (predicted from the tokens before it), ``-100`` otherwise. The first token is never a target.
* Nothing is truncated: over-long examples are dropped by :func:`filter_by_length`, which reports every drop by
  reason so pipelines can log and track it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from roll.pipelines.data.args import DataArgs, Task
from roll.pipelines.data.errors import DataError, describe_keys
from roll.pipelines.data.templates import (
    Piece,
    chat_pieces,
    pieces_to_ids,
    render_chat,
    tokenize_text,
    uses_chat_template,
    with_system,
)

__all__ = [
    "IGNORE_INDEX",
    "FilterReport",
    "carried_fields",
    "encode_preference",
    "encode_prompt",
    "encode_sft",
    "filter_by_length",
    "prepare_examples",
]

logger = logging.getLogger(__name__)

IGNORE_INDEX = -100


def _column(row: Mapping[str, Any], key: str, where: str, field_name: str) -> Any:
    if key not in row:
        raise DataError(
            f"{where}: missing key {key!r} (keys: {describe_keys(row)}); set data_args.{field_name} or fix the row"
        )
    return row[key]


def _prompt_text(row: Mapping[str, Any], args: DataArgs, where: str) -> Any:
    """The prompt column's text, followed by the query column's (``query_key``) after a newline when that is
    non-empty: ROLL's SFT rule (``prompt + "\\n" + query``; a null or empty query adds nothing)."""
    prompt = _column(row, args.prompt_key, where, "prompt_key")
    if args.query_key is None:
        return prompt
    if args.query_key not in row:
        raise DataError(
            f"{where}: missing query column {args.query_key!r} (keys: {describe_keys(row)}); give the row "
            f'"{args.query_key}": "" (or null) when it has no query, or fix data_args.query_key'
        )
    query = row[args.query_key]
    if query is None or query == "":
        return prompt
    if not isinstance(query, str) or not isinstance(prompt, str):
        raise DataError(
            f"{where}: prompt column {args.prompt_key!r} and query column {args.query_key!r} must be strings to be "
            f"joined; got {type(prompt).__name__} and {type(query).__name__}"
        )
    return f"{prompt}\n{query}"


def _system(row: Mapping[str, Any], args: DataArgs, where: str) -> str | None:
    """The row's system message: its ``system_key`` column when set and non-empty, else ``system_prompt``."""
    if args.system_key is None:
        return args.system_prompt
    system = _column(row, args.system_key, where, "system_key")
    if system is None or system == "":
        return args.system_prompt
    if not isinstance(system, str):
        raise DataError(f"{where}: system column {args.system_key!r} must be a string, got {type(system).__name__}")
    return system


def _prompt_messages(row: Mapping[str, Any], args: DataArgs, where: str) -> list[dict[str, Any]]:
    """The conversation that precedes the response: the messages column, or one user turn."""
    if args.messages_key is not None:
        messages = list(_column(row, args.messages_key, where, "messages_key"))
    else:
        messages = [{"role": "user", "content": _prompt_text(row, args, where)}]
    return with_system(messages, _system(row, args, where))


def _raw_prompt(row: Mapping[str, Any], args: DataArgs, where: str) -> str:
    """Prompt text without a chat template: the system message (if any) and the prompt, one per line."""
    prompt = _prompt_text(row, args, where)
    system = _system(row, args, where)
    return prompt if system is None else f"{system}\n{prompt}"


def _with_bos(tokenizer: Any, ids: list[int]) -> list[int]:
    # Without a template nothing renders the BOS text, so add it the way tokenizer(text) would.
    bos = getattr(tokenizer, "bos_token_id", None)
    return [bos, *ids] if bos is not None and (not ids or ids[0] != bos) else ids


def _response_target(
    tokenizer: Any, prompt_messages: list[dict[str, Any]], response: str, where: str, enable_thinking: bool | None
) -> str:
    """The text a model must generate after the templated prompt to answer ``response`` (ends with EOS)."""
    messages = [*prompt_messages, {"role": "assistant", "content": response}]
    pieces = chat_pieces(tokenizer, messages, where=where, enable_thinking=enable_thinking)
    return next(text for text, is_target in reversed(pieces) if is_target)


def encode_sft(row: Mapping[str, Any], tokenizer: Any, args: DataArgs, *, where: str = "row") -> dict[str, list[int]]:
    """``{"input_ids", "labels"}`` for one SFT row; labels are ``-100`` except on response (assistant) tokens.

    Chat rows train on every assistant turn; prompt/response rows on the response plus EOS. Text after the last
    target (e.g. a template's trailing newline) is dropped: the sequence ends where generation would stop.
    """
    pieces: list[Piece]
    if uses_chat_template(tokenizer, args):
        if args.messages_key is not None:
            messages = with_system(_column(row, args.messages_key, where, "messages_key"), args.system_prompt)
        else:
            response = _column(row, args.response_key, where, "response_key")
            messages = [*_prompt_messages(row, args, where), {"role": "assistant", "content": response}]
        pieces = chat_pieces(tokenizer, messages, where=where, enable_thinking=args.enable_thinking)
    else:
        response = _column(row, args.response_key, where, "response_key")
        pieces = [(_raw_prompt(row, args, where), False), (response + (tokenizer.eos_token or ""), True)]
    while pieces and not pieces[-1][1]:
        pieces.pop()
    ids, targets = pieces_to_ids(tokenizer, pieces)
    if not uses_chat_template(tokenizer, args):
        before = len(ids)
        ids = _with_bos(tokenizer, ids)
        targets = [False] * (len(ids) - before) + targets
    labels = [token if is_target else IGNORE_INDEX for token, is_target in zip(ids, targets)]
    if labels:
        labels[0] = IGNORE_INDEX  # nothing precedes the first token, so it cannot be predicted
    return {"input_ids": ids, "labels": labels}


def encode_preference(
    row: Mapping[str, Any], tokenizer: Any, args: DataArgs, *, where: str = "row"
) -> dict[str, list[int]]:
    """``{"prompt_ids", "chosen_ids", "rejected_ids"}``: the prompt once, each response as its target tokens."""
    chosen = _column(row, args.chosen_key, where, "chosen_key")
    rejected = _column(row, args.rejected_key, where, "rejected_key")
    if uses_chat_template(tokenizer, args):
        messages = _prompt_messages(row, args, where)
        prompt_ids = tokenize_text(
            tokenizer,
            render_chat(tokenizer, messages, add_generation_prompt=True, enable_thinking=args.enable_thinking),
        )
        chosen_text = _response_target(tokenizer, messages, chosen, where, args.enable_thinking)
        rejected_text = _response_target(tokenizer, messages, rejected, where, args.enable_thinking)
    else:
        prompt_ids = _with_bos(tokenizer, tokenize_text(tokenizer, _raw_prompt(row, args, where)))
        eos = tokenizer.eos_token or ""
        chosen_text, rejected_text = chosen + eos, rejected + eos
    return {
        "prompt_ids": prompt_ids,
        "chosen_ids": tokenize_text(tokenizer, chosen_text),
        "rejected_ids": tokenize_text(tokenizer, rejected_text),
    }


def encode_prompt(row: Mapping[str, Any], tokenizer: Any, args: DataArgs, *, where: str = "row") -> dict[str, Any]:
    """An RL prompt: ``prompt_ids`` (ending with the generation prompt) plus carried-through fields.

    Carried fields: ``prompt`` (the prompt column's text; for chat rows the last user message), ``tag`` (from
    ``tag_key``, else ``default_tag``), ``domain`` (from ``domain_key``; None where the row has none), every
    ``extra_keys`` column, every ``optional_keys`` column (None where the row has none) and, for chat rows,
    ``messages``.
    """
    out: dict[str, Any] = {}
    if uses_chat_template(tokenizer, args):
        messages = _prompt_messages(row, args, where)
        out["prompt_ids"] = tokenize_text(
            tokenizer,
            render_chat(tokenizer, messages, add_generation_prompt=True, enable_thinking=args.enable_thinking),
        )
        if args.messages_key is not None:
            out["messages"] = messages
            users = [m["content"] for m in messages if m.get("role") == "user"]
            out["prompt"] = users[-1] if users else ""
        else:
            out["prompt"] = row[args.prompt_key]
    else:
        out["prompt_ids"] = _with_bos(tokenizer, tokenize_text(tokenizer, _raw_prompt(row, args, where)))
        out["prompt"] = row[args.prompt_key]
    out.update(carried_fields(row, args, where=where))
    return out


def carried_fields(row: Mapping[str, Any], args: DataArgs, *, where: str = "row") -> dict[str, Any]:
    """The fields an RL prompt carries beside its text and ids: ``domain`` (when ``domain_key`` is set; None where
    the row names none, so every prompt has the same fields), ``tag``, the ``extra_keys`` columns and the
    ``optional_keys`` ones (None where absent). :func:`encode_prompt` and ``roll validate`` read them here."""
    out: dict[str, Any] = {}
    if args.domain_key is not None:
        out["domain"] = row.get(args.domain_key)
    if args.tag_key in row:
        out["tag"] = row[args.tag_key]
    elif args.default_tag is not None:
        out["tag"] = args.default_tag
    else:
        _column(row, args.tag_key, where, "tag_key (or data_args.default_tag)")
    for key in args.extra_keys:
        out[key] = _column(row, key, where, "extra_keys")
    for key in args.optional_keys:
        out[key] = row.get(key)
    return out


@dataclass
class FilterReport:
    """What :func:`filter_by_length` kept and dropped, by reason (with the dropped input positions)."""

    total: int
    kept: int
    dropped_by_reason: dict[str, int] = field(default_factory=dict)
    dropped_indices: dict[str, list[int]] = field(default_factory=dict)

    @property
    def dropped(self) -> int:
        return self.total - self.kept

    def summary(self, name: str = "dataset") -> str:
        """``"train: kept 95/100 (dropped 5: too_long=3, empty_prompt=2)"``."""
        reasons = ", ".join(f"{reason}={count}" for reason, count in sorted(self.dropped_by_reason.items()))
        return f"{name}: kept {self.kept}/{self.total}" + (f" (dropped {self.dropped}: {reasons})" if reasons else "")

    def as_metrics(self, prefix: str = "data") -> dict[str, float]:
        """Flat metrics for a tracker: totals and one ``{prefix}/dropped/{reason}`` entry per reason."""
        metrics = {f"{prefix}/total": float(self.total), f"{prefix}/kept": float(self.kept)}
        metrics.update({f"{prefix}/dropped/{r}": float(c) for r, c in self.dropped_by_reason.items()})
        return metrics

    def log(self, name: str = "dataset") -> None:
        """Log the summary: a warning when anything was dropped, else info."""
        (logger.warning if self.dropped else logger.info)("%s", self.summary(name))


def _lengths(example: Mapping[str, Any]) -> tuple[int, int, bool]:
    """(prompt tokens, response tokens, has targets) of an encoded example of any kind."""
    if "labels" in example:
        labels = example["labels"]
        first = next((i for i, label in enumerate(labels) if label != IGNORE_INDEX), len(labels))
        return first, len(labels) - first, first < len(labels)
    prompt = len(example["prompt_ids"])
    if "chosen_ids" in example:
        chosen, rejected = len(example["chosen_ids"]), len(example["rejected_ids"])
        return prompt, max(chosen, rejected), min(chosen, rejected) > 0
    return prompt, 0, True


def _drop_reason(
    example: Mapping[str, Any], max_length: int | None, max_prompt: int | None, max_response: int | None
) -> str | None:
    prompt, response, has_targets = _lengths(example)
    if "labels" not in example and prompt == 0:
        return "empty_prompt"
    if not has_targets:
        return "empty_response" if "chosen_ids" in example else "no_target_tokens"
    if max_prompt is not None and prompt > max_prompt:
        return "prompt_too_long"
    if max_response is not None and response > max_response:
        return "response_too_long"
    if max_length is not None and prompt + response > max_length:
        return "too_long"
    return None


def filter_by_length(
    encoded: Sequence[Mapping[str, Any]],
    *,
    max_length: int | None = None,
    max_prompt_length: int | None = None,
    max_response_length: int | None = None,
    allow_empty: bool = False,
    name: str = "dataset",
) -> tuple[list[Mapping[str, Any]], FilterReport]:
    """Keep the examples within the limits; report every drop by reason.

    Works on the output of any ``encode_*``. For SFT examples the prompt is everything before the first target
    token; for preference examples the response is the longer of chosen/rejected. Reasons: ``empty_prompt``,
    ``no_target_tokens``, ``empty_response``, ``prompt_too_long``, ``response_too_long``, ``too_long``.

    Raises:
        DataError: when nothing is kept (unless ``allow_empty``), with the report in the message.
    """
    kept: list[Mapping[str, Any]] = []
    report = FilterReport(total=len(encoded), kept=0)
    for index, example in enumerate(encoded):
        reason = _drop_reason(example, max_length, max_prompt_length, max_response_length)
        if reason is None:
            kept.append(example)
            continue
        report.dropped_by_reason[reason] = report.dropped_by_reason.get(reason, 0) + 1
        report.dropped_indices.setdefault(reason, []).append(index)
    report.kept = len(kept)
    if not kept and not allow_empty:
        raise DataError(
            f"no examples left after length filtering ({report.summary(name)}); raise data_args.max_length / "
            f"max_prompt_length / max_response_length or check that the rows have responses"
        )
    return kept, report


_ENCODERS: dict[str, Callable[..., dict[str, Any]]] = {
    "sft": encode_sft,
    "preference": encode_preference,
    "prompt": encode_prompt,
}


def _in_split(row: Mapping[str, Any], args: DataArgs) -> bool:
    return args.keep_split is None or args.split_key not in row or row[args.split_key] == args.keep_split


def prepare_examples(
    rows: Sequence[Mapping[str, Any]], task: Task, tokenizer: Any, args: DataArgs, *, name: str = "dataset"
) -> tuple[list[Mapping[str, Any]], FilterReport]:
    """Encode the rows of ``args.keep_split`` (every row when unset) for ``task`` and filter by the limits in
    ``args``; the report (its indices are positions in ``rows``) is logged and returned."""
    encoder = _ENCODERS[task]
    positions = [i for i, row in enumerate(rows) if _in_split(row, args)]
    if rows and not positions:
        values = sorted({str(row[args.split_key]) for row in rows})
        raise DataError(
            f"{name}: no row has {args.split_key}={args.keep_split!r} (the rows' values: {', '.join(values)}); set "
            f"data_args.keep_split to one of them, or null to read every row"
        )
    encoded = [encoder(rows[i], tokenizer, args, where=f"{name} row {i}") for i in positions]
    if task == "prompt":
        kept, report = filter_by_length(encoded, name=name, max_prompt_length=args.max_prompt_length)
    else:
        kept, report = filter_by_length(
            encoded,
            name=name,
            max_prompt_length=args.max_prompt_length,
            max_length=args.max_length,
            max_response_length=args.max_response_length,
        )
    others = [i for i, row in enumerate(rows) if not _in_split(row, args)]
    if others:
        report.total = len(rows)
        report.dropped_indices = {
            reason: [positions[i] for i in indices] for reason, indices in report.dropped_indices.items()
        }
        report.dropped_by_reason["other_split"] = len(others)
        report.dropped_indices["other_split"] = others
    report.log(name)
    return kept, report
