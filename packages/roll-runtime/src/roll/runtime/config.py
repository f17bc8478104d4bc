"""Validated configuration models shared by every layer above the runtime.

``RollModel`` is the base of every roll config: unknown fields are rejected, and a failed validation raises one
:class:`ConfigError` that lists every problem with its field path, the bad value and how to fix it.
"""

from __future__ import annotations

import ast
import contextvars
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from roll.runtime.errors import ConfigError

if TYPE_CHECKING:
    from typing import Self

__all__ = [
    "RollModel",
    "WorkerConfig",
    "check_settings",
    "format_validation_error",
    "parse_device_mapping",
    "validation_error_lines",
]


def validation_error_lines(error: ValidationError, root: str = "") -> list[str]:
    """One string per problem: ``path: message (got: value)``."""
    lines = []
    for item in error.errors():
        path = ".".join(str(part) for part in (root, *item["loc"]) if part != "")
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            message = "unknown field; remove it or check its spelling"
        value = item.get("input")
        shown = (
            "" if item["type"] in ("missing", "extra_forbidden") or isinstance(value, dict) else f" (got: {value!r})"
        )
        lines.append(f"{path or '<root>'}: {message}{shown}")
    return lines


def format_validation_error(error: ValidationError, root: str = "") -> str:
    """A header and one indented line per problem."""
    lines = validation_error_lines(error, root)
    count = len(lines)
    return f"{count} configuration error{'s' if count != 1 else ''}:\n" + "\n".join(f"  {line}" for line in lines)


# Depth of RollModel constructions in progress: pydantic calls a custom __init__ for nested models too, and
# only the outermost one may turn the (aggregated) ValidationError into a ConfigError.
_DEPTH: contextvars.ContextVar[int] = contextvars.ContextVar("roll_model_depth", default=0)


class RollModel(BaseModel):
    """Base for roll's config models: extra fields forbidden, validation errors raised as one ConfigError."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, arbitrary_types_allowed=True)

    def __init__(self, **data: Any) -> None:
        token = _DEPTH.set(_DEPTH.get() + 1)
        try:
            super().__init__(**data)
        except ValidationError as e:
            if _DEPTH.get() > 1:  # nested inside another model's validation: let the outer one report it
                raise
            raise ConfigError(format_validation_error(e, type(self).__name__)) from None
        finally:
            _DEPTH.reset(token)

    @classmethod
    def validate_raw(cls, obj: Any) -> Any:
        """Like ``model_validate`` but raises pydantic's ValidationError (every error, with its location)."""
        token = _DEPTH.set(_DEPTH.get() + 1)
        try:
            return BaseModel.model_validate.__func__(cls, obj)  # type: ignore[attr-defined]
        finally:
            _DEPTH.reset(token)

    @classmethod
    def model_validate(cls, obj: Any, *args: Any, **kwargs: Any) -> Self:
        token = _DEPTH.set(_DEPTH.get() + 1)
        try:
            return super().model_validate(obj, *args, **kwargs)
        except ValidationError as e:
            if _DEPTH.get() > 1:
                raise
            raise ConfigError(format_validation_error(e)) from None
        finally:
            _DEPTH.reset(token)


_Settings = TypeVar("_Settings", bound=BaseModel)


def check_settings(model: type[_Settings], data: Any, label: str, *, root: str = "", hint: str = "") -> _Settings:
    """``model`` validated from ``data``, or one ConfigError ``"label: root.key: problem; ...hint"``: the same report
    whether or not another model's validation is running (inside one, RollModel leaves pydantic's error to the outer
    model; outside, it formats it on its own), e.g. an env's settings checked by its config entry and by the env."""
    token = _DEPTH.set(_DEPTH.get() + 1)  # keep pydantic's error, with its locations, at every depth
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise ConfigError(f"{label}: {'; '.join(validation_error_lines(e, root=root))}{hint}") from None
    finally:
        _DEPTH.reset(token)


_ALLOWED_CALLS = {"list", "range"}


def _eval_mapping_node(node: ast.AST, text: str) -> list[int]:
    if isinstance(node, ast.List | ast.Tuple):
        return [_int_literal(elt, text) for elt in node.elts]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _eval_mapping_node(node.left, text) + _eval_mapping_node(node.right, text)
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in _ALLOWED_CALLS
        and not node.keywords
    ):
        if node.func.id == "list" and len(node.args) == 1:
            return _eval_mapping_node(node.args[0], text)
        if node.func.id == "range" and 1 <= len(node.args) <= 3:
            return list(range(*(_int_literal(a, text) for a in node.args)))
    raise ValueError(
        f"device_mapping {text!r} is not understood: use a list of device ids like [0, 1, 2, 3], "
        f"'list(range(0, 4))', or '0,1,2,3'"
    )


def _int_literal(node: ast.AST, text: str) -> int:
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_int_literal(node.operand, text)
    raise ValueError(f"device_mapping {text!r} may contain only integer literals")


def parse_device_mapping(value: Any) -> list[int] | None:
    """Device ids from a list, ``"0,1,2"`` or ROLL's ``"list(range(0, 8))"`` form (parsed, never ``eval``-ed)."""
    if value is None:
        return None
    if isinstance(value, str):
        text = value.strip()
        if not text:
            return None
        if all(part.strip().lstrip("-").isdigit() for part in text.split(",")):
            return [int(part) for part in text.split(",")]
        try:
            tree = ast.parse(text, mode="eval")
        except SyntaxError:
            raise ValueError(
                f"device_mapping {value!r} is not valid: use e.g. 'list(range(0, 4))' or [0, 1, 2, 3]"
            ) from None
        return _eval_mapping_node(tree.body, text)
    if isinstance(value, range):
        return list(value)
    if isinstance(value, list | tuple):
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise ValueError(f"device_mapping must contain integer device ids, got {list(value)!r}")
        return list(value)
    raise ValueError(f"device_mapping must be a list of device ids or a string like 'list(range(0, 4))', got {value!r}")


class WorkerConfig(RollModel):
    """How one role (cluster) is deployed: which class, how many workers, on which devices.

    GPU roles set ``device_mapping`` (global device ids) and ``num_gpus_per_worker``; the number of workers is
    derived: ``world_size = len(device_mapping) / num_gpus_per_worker``. CPU roles omit ``device_mapping`` and set
    ``world_size`` directly.
    """

    name: str = Field(default="worker", description="Cluster name; actors are named '{name}-{rank}'.")
    worker_cls: Any = Field(default=None, description="Worker class, or its dotted path 'pkg.module.Class'.")
    device_mapping: list[int] | None = Field(default=None, description="Global device ids, or 'list(range(a, b))'.")
    num_gpus_per_worker: int = Field(
        default=1,
        ge=1,
        description="Devices each worker owns (e.g. vLLM TP x PP); on one node, unless the worker runs one engine "
        "over several nodes (Worker.spans_nodes: vllm, sglang).",
    )
    world_size: int | None = Field(default=None, ge=1, description="Number of workers; derived for GPU roles.")
    num_cpus_per_worker: float = Field(default=0.01, ge=0, description="Logical CPUs Ray reserves per worker.")
    num_threads: Annotated[int, Field(ge=1)] | Literal["all"] | None = Field(
        default=None,
        description=(
            "torch/OpenMP threads per worker. None: Ray's default (1 unless num_cpus_per_worker >= 2). 'all': the "
            "worker's usable cores shared among this role's workers on its node, for roles that take turns with "
            "others (a pipeline's phases) rather than run at the same time."
        ),
    )
    strategy_args: Any = Field(default=None, description="Backend selection and settings, opaque to the runtime.")
    system_envs: dict[str, str] = Field(default_factory=dict, description="Extra environment variables for workers.")
    max_concurrency: int | None = Field(default=None, ge=1, description="Concurrent calls per worker actor.")
    rpc_timeout_s: float = Field(default=3600.0, gt=0, description="Seconds any call to this role may take.")
    start_timeout_s: float = Field(default=300.0, gt=0, description="Seconds to wait for workers to be scheduled.")

    @field_validator("device_mapping", mode="before")
    @classmethod
    def _parse_device_mapping(cls, value: Any) -> list[int] | None:
        return parse_device_mapping(value)

    @field_validator("worker_cls")
    @classmethod
    def _check_worker_cls(cls, value: Any) -> Any:
        if value is None or isinstance(value, type):
            return value
        if isinstance(value, str) and "." in value.replace(":", "."):
            return value
        raise ValueError("worker_cls must be a class or a dotted path like 'my_package.workers.MyWorker'")

    @model_validator(mode="before")
    @classmethod
    def _fill_world_size(cls, data: Any) -> Any:
        # world_size is derived in the raw data (1 for CPU roles, devices / devices-per-worker for GPU roles), so a
        # validated config is never changed afterwards; _check_devices below reports any contradiction.
        if not isinstance(data, dict) or data.get("world_size") is not None:
            return data
        try:
            mapping = parse_device_mapping(data.get("device_mapping"))
            per_worker = int(data.get("num_gpus_per_worker", 1))
        except (TypeError, ValueError):
            return data  # the field validators name the bad value
        if mapping is None:
            return {**data, "world_size": 1}
        if mapping and per_worker >= 1 and len(mapping) % per_worker == 0:
            return {**data, "world_size": len(mapping) // per_worker}
        return data

    @model_validator(mode="after")
    def _check_devices(self) -> WorkerConfig:
        mapping = self.device_mapping
        if mapping is None:
            return self
        if not mapping:
            raise ValueError("device_mapping is empty: list at least one device id, or remove it to run CPU workers")
        if len(set(mapping)) != len(mapping):
            duplicates = sorted({d for d in mapping if mapping.count(d) > 1})
            raise ValueError(f"device_mapping lists devices {duplicates} more than once; each id may appear once")
        if min(mapping) < 0:
            raise ValueError(f"device_mapping has negative ids {[d for d in mapping if d < 0]}; ids start at 0")
        if len(mapping) % self.num_gpus_per_worker:
            raise ValueError(
                f"device_mapping has {len(mapping)} devices, which is not a multiple of num_gpus_per_worker="
                f"{self.num_gpus_per_worker}; change device_mapping to a multiple of {self.num_gpus_per_worker} "
                f"devices or change num_gpus_per_worker"
            )
        derived = len(mapping) // self.num_gpus_per_worker
        if self.world_size != derived:
            raise ValueError(
                f"world_size={self.world_size} contradicts device_mapping ({len(mapping)} devices) / num_gpus_per_worker "
                f"({self.num_gpus_per_worker}) = {derived}; remove world_size (it is derived) or fix device_mapping"
            )
        return self

    def devices_of(self, rank: int) -> list[int]:
        """Global device ids owned by ``rank`` (consecutive groups of ``num_gpus_per_worker``)."""
        if self.device_mapping is None:
            return []
        n = self.num_gpus_per_worker
        return self.device_mapping[rank * n : (rank + 1) * n]
