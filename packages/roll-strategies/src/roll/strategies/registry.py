"""The strategy registry: backend name -> implementation and config model, both resolved lazily.

Third-party backends register through the ``roll.strategies`` entry-point group (implementation) and
``roll.strategy_configs`` (config model). Built-ins are listed here; none of their libraries is imported until
the backend is used.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from roll.runtime import ConfigError, MissingExtraError, Registry, RollError, RollModel
from roll.runtime.config import validation_error_lines

if TYPE_CHECKING:
    from roll.runtime import Worker
    from roll.strategies.base import InferenceStrategy

__all__ = [
    "HF_LOADING_STRATEGIES",
    "STRATEGIES",
    "STRATEGY_CONFIGS",
    "check_attention_installed",
    "check_backend_installed",
    "create_strategy",
    "multi_node_strategies",
    "runs_across_nodes",
    "sets_learning_rate_mid_run",
    "strategies_with",
    "validate_strategy_config",
]

STRATEGIES: Registry[type[InferenceStrategy]] = Registry("strategy", entry_point_group="roll.strategies")
STRATEGY_CONFIGS: Registry[type[RollModel]] = Registry("strategy", entry_point_group="roll.strategy_configs")

_PACKAGE = "roll-strategies"
# name: (implementation, config model, pip extra providing the backend's library)
_BUILTINS: dict[str, tuple[str, str, str | None]] = {
    "hf_infer": ("roll.strategies.hf.strategy:HfInferStrategy", "roll.strategies.hf.config:HfInferConfig", None),
    "fsdp2_train": (
        "roll.strategies.fsdp2.strategy:Fsdp2TrainStrategy",
        "roll.strategies.fsdp2.config:Fsdp2Config",
        "fsdp2",
    ),
    "fsdp2_infer": (
        "roll.strategies.fsdp2.strategy:Fsdp2InferStrategy",
        "roll.strategies.fsdp2.config:Fsdp2Config",
        "fsdp2",
    ),
    "vllm": ("roll.strategies.vllm.strategy:VllmStrategy", "roll.strategies.vllm.config:VllmConfig", "vllm"),
    "sglang": (
        "roll.strategies.sglang.strategy:SglangStrategy",
        "roll.strategies.sglang.config:SglangConfig",
        "sglang",
    ),
    "megatron_train": (
        "roll.strategies.megatron.strategy:MegatronTrainStrategy",
        "roll.strategies.megatron.config:MegatronConfig",
        "megatron",
    ),
    "megatron_infer": (
        "roll.strategies.megatron.strategy:MegatronInferStrategy",
        "roll.strategies.megatron.config:MegatronConfig",
        "megatron",
    ),
    "mock_infer": (
        "roll.strategies.mock.strategy:MockInferStrategy",
        "roll.strategies.mock.config:MockInferConfig",
        None,
    ),
}

# extra -> the modules it provides that a backend imports, looked up without importing them (``roll validate``).
# fsdp2's extra (peft) is needed only for LoRA.
_EXTRA_MODULES: dict[str, tuple[str, ...]] = {
    "vllm": ("vllm",),
    "sglang": ("sglang",),
    "megatron": ("megatron.core",),
    "fsdp2": ("peft",),
}
_LORA_ONLY_EXTRAS = {"fsdp2"}


def _module_installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a missing parent package of a dotted name
        return False


def check_backend_installed(strategy_name: str, *, lora: bool = False, where: str | None = None) -> None:
    """Raise MissingExtraError (with its pip command) if backend ``strategy_name``'s library is not installed; with
    ``where`` (the config field naming the backend, e.g. ``teachers.t1.strategy_args.strategy_name``) the error names
    it and its other fix, as several roles may name one backend.

    Nothing is imported: the backend's modules are only looked up, so this is cheap and safe on a machine without
    accelerators. Unknown names raise ConfigError listing the known ones; plug-in backends are not checked.
    """
    if strategy_name not in STRATEGIES:
        raise ConfigError(f"unknown strategy {strategy_name!r}; known names: {', '.join(STRATEGIES.names())}")
    extra = _BUILTINS[strategy_name][2] if strategy_name in _BUILTINS else None
    if extra is None or (extra in _LORA_ONLY_EXTRAS and not lora):
        return
    missing = [m for m in _EXTRA_MODULES.get(extra, ()) if not _module_installed(m)]
    if missing:
        raise MissingExtraError(
            f"strategy {strategy_name!r}" + (f" ({where})" if where else ""),
            _PACKAGE,
            extra,
            cause=f"no module named {missing[0]!r}",
            note=f"or set {where} to a strategy installed here" if where else None,
        )


# attn_implementation -> the module transformers imports for it (flash-attn's packages build for CUDA GPUs only).
_ATTENTION_MODULES = {"flash_attention_2": "flash_attn", "flash_attention_3": "flash_attn_interface"}
HF_LOADING_STRATEGIES = frozenset({"hf_infer", "fsdp2_train", "fsdp2_infer"})
"""The built-in backends that load the model with transformers, and so honour ``model_args.attn_implementation``
(vLLM, SGLang and Megatron choose their own attention kernels)."""


def check_attention_installed(attn_implementation: str | None, where: str = "model_args.attn_implementation") -> None:
    """Raise ConfigError, naming ``where`` and the fix, if ``attn_implementation`` needs a kernel package that is not
    installed (a ROLL file's ``fa2`` on a machine without flash-attn: transformers refuses it when the model loads)."""
    module = _ATTENTION_MODULES.get(attn_implementation or "")
    if module is not None and not _module_installed(module):
        raise ConfigError(
            f"{where}={attn_implementation!r} needs the {module!r} module (flash-attn, which builds for CUDA GPUs "
            f"only), not installed here: install it where the workers run, or set {where} to sdpa (PyTorch's "
            "attention, any device) or null (the model's default)"
        )


for _name, (_impl, _config, _extra) in _BUILTINS.items():
    STRATEGIES.register(_name, _impl, package=_PACKAGE, extra=_extra)
    STRATEGY_CONFIGS.register(_name, _config, package=_PACKAGE)


def validate_strategy_config(strategy_name: str, strategy_config: dict[str, Any] | None) -> RollModel:
    """The backend's validated config model for ``strategy_config`` (pydantic only; no backend import)."""
    config_cls = STRATEGY_CONFIGS.get(strategy_name)
    try:
        return config_cls.model_validate(strategy_config or {})
    except ValidationError as e:  # raised as is when validated inside a larger config
        problems = "; ".join(validation_error_lines(e, "strategy_args.strategy_config"))
        raise ConfigError(f"{problems} (backend {strategy_name})") from None
    except ConfigError as e:
        raise ConfigError(f"strategy_args.strategy_config ({strategy_name}): {e}") from None


def create_strategy(worker: Worker) -> InferenceStrategy:
    """Build the strategy named by ``worker.worker_config.strategy_args.strategy_name`` for ``worker``."""
    strategy_args = getattr(worker.worker_config, "strategy_args", None)
    if strategy_args is None:
        raise ConfigError(f"{worker.worker_config.name}.strategy_args is not set; choose one of {STRATEGIES.names()}")
    strategy_cls = STRATEGIES.get(strategy_args.strategy_name)
    config = validate_strategy_config(strategy_args.strategy_name, strategy_args.strategy_config)
    return strategy_cls(worker, config)


def _capability(strategy_name: str, flag: str) -> bool:
    """A backend's capability flag (``multi_node_engine``, ``mid_run_learning_rate``), declared on its config model
    (so no backend import)."""
    return bool(getattr(STRATEGY_CONFIGS.get(strategy_name), flag, False))


def _multi_node(strategy_name: str) -> bool:
    return _capability(strategy_name, "multi_node_engine")


def runs_across_nodes(worker_config: Any) -> bool:
    """Whether the backend of ``worker_config.strategy_args`` runs one engine over several nodes, so one worker may
    own devices on more than one node (see :meth:`roll.runtime.Worker.spans_nodes`)."""
    strategy_args = getattr(worker_config, "strategy_args", None)
    if strategy_args is None or strategy_args.strategy_name not in STRATEGIES:
        return False
    return _multi_node(strategy_args.strategy_name)


def strategies_with(flag: str) -> list[str]:
    """Registered backends declaring capability ``flag`` (for error messages that name the alternatives)."""
    names = []
    for name in STRATEGY_CONFIGS.names():
        try:
            if _capability(name, flag):
                names.append(name)
        except RollError:  # a plug-in whose config cannot be imported here is not named
            continue
    return names


def multi_node_strategies() -> list[str]:
    """Registered backends whose engine can span nodes."""
    return strategies_with("multi_node_engine")


def sets_learning_rate_mid_run(strategy_name: str) -> bool:
    """Whether the training backend ``strategy_name`` implements :meth:`TrainStrategy.set_learning_rate`."""
    return strategy_name in STRATEGIES and _capability(strategy_name, "mid_run_learning_rate")
