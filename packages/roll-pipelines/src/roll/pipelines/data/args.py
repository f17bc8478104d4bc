"""``DataArgs``: where a pipeline's data comes from and how rows become token sequences.

Column-name fields end in ``_key`` (``prompt_key``, ``response_key``, ...). ROLL's spellings (``prompt``,
``response``, ``messages``, ``tag``) are accepted as aliases so ROLL-style YAML files load unchanged.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import AliasChoices, Field, ValidationInfo, field_validator, model_validator

from roll.runtime.config import RollModel

__all__ = ["RESERVED_COLUMNS", "DataArgs", "Task"]

Task = Literal["sft", "preference", "prompt"]

# Columns the encoders and collators create themselves; an extra key with one of these names would be overwritten.
RESERVED_COLUMNS = frozenset(
    {
        "input_ids",
        "labels",
        "attention_mask",
        "position_ids",
        "loss_mask",
        "prompt_ids",
        "chosen_ids",
        "rejected_ids",
        "prompt",
        "messages",
        "tag",
        "domain",
        "uid",
    }
)


def _alias(*names: str) -> AliasChoices:
    return AliasChoices(*names)


class DataArgs(RollModel):
    """Dataset files, column names, chat formatting and length limits.

    Row formats:

    * prompt/response rows: ``{prompt_key: str, response_key: str}`` (SFT), ``{prompt_key, chosen_key,
      rejected_key}`` (preference), ``{prompt_key}`` plus ``tag_key`` and ``extra_keys`` (RL prompts);
    * chat rows: when ``messages_key`` is set it replaces ``prompt_key``/``response_key``: a list of
      ``{"role": ..., "content": ...}`` (or that list written as a JSON string, as ROLL's data files hold it);
      SFT trains on assistant turns only.

    Length limits are in tokens; rows over a limit are dropped and counted (see ``filter_by_length``), never
    silently truncated.
    """

    file_name: str | list[str] = Field(
        description="Training data: json/jsonl/parquet/arrow/csv paths, save_to_disk folders, hub dataset names or "
        "synthetic:// URIs."
    )
    eval_file_name: str | list[str] | None = Field(default=None, description="Evaluation data, same forms.")
    prompt_key: str = Field(default="prompt", validation_alias=_alias("prompt_key", "prompt"))
    response_key: str = Field(default="response", validation_alias=_alias("response_key", "response"))
    query_key: str | None = Field(
        default=None,
        description="Optional second prompt column (Alpaca 'input'), appended to the prompt after a newline when "
        "non-empty (ROLL's query_key); null or '' adds nothing. Not with messages_key.",
    )
    messages_key: str | None = Field(
        default=None,
        validation_alias=_alias("messages_key", "messages"),
        description="Column with chat messages (a list, or the list as a JSON string as in ROLL's data files); when "
        "set, used instead of prompt_key/response_key.",
    )
    chosen_key: str = Field(default="chosen", description="Preferred response column (preference data).")
    rejected_key: str = Field(default="rejected", description="Dispreferred response column (preference data).")
    tag_key: str = Field(
        default="tag", validation_alias=_alias("tag_key", "tag"), description="Domain column for RL routing."
    )
    domain_key: str | None = Field(
        default=None,
        description="RL prompts: column naming each row's reward domain (ROLL's 'domain'); a row with a value is "
        "scored by that domain whatever its tag (the tag joins the domain's tag_included). null: routed by tag only.",
    )
    default_tag: str | None = Field(
        default=None, description="Tag for RL rows without a tag column; None makes the column required."
    )
    split_key: str = Field(default="split", description="Column naming each row's split (read with keep_split).")
    keep_split: str | None = Field(
        default=None,
        description="Keep only the rows whose split_key column equals this (a file holding several splits, as "
        "GSM8K_zh's 'split': train/test); rows without the column are kept, the others dropped and counted as "
        "other_split. null: every row.",
    )
    extra_keys: list[str] = Field(
        default_factory=list, description="Columns carried through to batches as non-tensors (e.g. ground_truth)."
    )
    optional_keys: list[str] = Field(
        default_factory=list,
        description="RL prompts: columns carried through when a row has them, null when it has not (per-domain "
        "columns of a multi-domain file, e.g. code rows' test_cases); a reward domain that needs one still fails at "
        "load, naming the row. extra_keys columns are required in every row.",
    )
    system_prompt: str | None = Field(
        default=None,
        description="System message prepended to every conversation (a chat template that refuses the system role, "
        "as Gemma 2's, gets its text in front of the first user message's).",
    )
    system_key: str | None = Field(
        default=None,
        description="Column with each row's system message (ROLL's system_key); a row whose value is null or empty "
        "gets system_prompt (if any). Not with messages_key (a conversation carries its own).",
    )
    apply_chat_template: bool = Field(default=True, description="Format with the tokenizer's chat template.")
    enable_thinking: bool | None = Field(
        default=None,
        description="Passed to a chat template that reads it (Qwen3-style): false renders prompts with an empty "
        "think block (no thinking), true asks for thinking; null: the template's own default. Other templates "
        "render the same either way.",
    )
    max_length: int | None = Field(default=None, ge=2, description="Longest prompt + response (SFT, preference).")
    max_prompt_length: int | None = Field(default=None, ge=1, description="Longest prompt in tokens.")
    max_response_length: int | None = Field(default=None, ge=1, description="Longest response in tokens.")
    pack_sequences: bool = Field(default=False, description="SFT: pack several examples into each row.")
    shuffle: bool = Field(default=True, description="Reshuffle rows every epoch.")
    drop_last: bool = Field(default=True, description="Skip an epoch's last, incomplete batch.")
    seed: int = Field(default=0, description="Seed of the shuffling order.")
    cache_dir: str | None = Field(
        default=None, description="Where synthetic:// data is written; default $ROLL_DATA_CACHE or ~/.cache/roll/data."
    )

    @field_validator("file_name", "eval_file_name")
    @classmethod
    def _check_files(cls, value: Any) -> Any:
        if value is None:
            return value
        names = [value] if isinstance(value, str) else value
        if not names:
            raise ValueError("no data files listed; give at least one path or synthetic:// URI")
        if any(not name.strip() for name in names):
            raise ValueError("a data file name is empty; remove it or give the path")
        return value

    @field_validator("extra_keys", "optional_keys")
    @classmethod
    def _check_carried_keys(cls, value: list[str], info: ValidationInfo) -> list[str]:
        reserved = sorted(set(value) & RESERVED_COLUMNS)
        if reserved:
            raise ValueError(f"{info.field_name} {reserved} clash with columns the data pipeline creates; rename them")
        if len(set(value)) != len(value):
            raise ValueError(f"{info.field_name} lists a column more than once")
        return value

    @model_validator(mode="after")
    def _check_optional_keys(self) -> DataArgs:
        both = sorted(set(self.extra_keys) & set(self.optional_keys))
        if both:
            raise ValueError(f"{both} are in both extra_keys (required) and optional_keys; keep each in one")
        return self

    @model_validator(mode="after")
    def _check_query_key(self) -> DataArgs:
        if self.query_key is not None and self.messages_key is not None:
            raise ValueError(
                f"query_key={self.query_key!r} and messages_key={self.messages_key!r} are both set; a query column "
                "extends prompt_key's text, so unset one of them"
            )
        if self.system_key is not None and self.messages_key is not None:
            raise ValueError(
                f"system_key={self.system_key!r} and messages_key={self.messages_key!r} are both set; a messages "
                "column carries its own system message, so unset system_key"
            )
        return self

    @model_validator(mode="after")
    def _check_lengths(self) -> DataArgs:
        prompt, response, total = self.max_prompt_length, self.max_response_length, self.max_length
        if total is not None and prompt is not None and prompt >= total:
            raise ValueError(
                f"max_prompt_length={prompt} leaves no room for a response within max_length={total}; "
                f"lower max_prompt_length or raise max_length"
            )
        if total is not None and response is not None and response >= total:
            raise ValueError(
                f"max_response_length={response} leaves no room for a prompt within max_length={total}; "
                f"lower max_response_length or raise max_length"
            )
        return self

    def files(self, split: str = "train") -> list[str]:
        """The files of ``split`` ("train" or "eval") as a list; empty when no eval files are configured."""
        names = self.file_name if split == "train" else self.eval_file_name
        if names is None:
            return []
        return [names] if isinstance(names, str) else list(names)

    def field_for(self, split: str) -> str:
        """The config field that lists ``split``'s files, for error messages."""
        return "data_args.file_name" if split == "train" else "data_args.eval_file_name"
