"""A ROLL role's strategy in roll's shape: ``strategy_args`` (names, ``strategy_config`` keys, engine pass-through) and
the strategy settings ROLL keeps elsewhere in the role (sglang's GPU span, ``model_args.ulysses_size``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from roll.pipelines.compat.keys import MODEL_ARGS, ROLL_DTYPES, STRATEGY_NAMES

if TYPE_CHECKING:
    from roll.pipelines.compat.translate import _Translator

__all__ = ["strategy_from_role", "translate_strategy"]

_STRATEGY_PASSTHROUGH = {"vllm": "engine_kwargs", "sglang": "engine_kwargs"}


def strategy_from_role(top: _Translator, path: str, raw: dict[str, Any], out: dict[str, Any]) -> None:
    """Strategy settings ROLL reads from other parts of role ``raw``, placed into ``out``'s ``strategy_args``."""
    _sglang_tp(top, path, raw, out)
    _ulysses(top, path, raw, out)


def _sglang_tp(top: _Translator, path: str, raw: dict[str, Any], out: dict[str, Any]) -> None:
    """ROLL's sglang engine spans the worker's GPUs (tp_size = num_gpus_per_worker) unless the config says."""
    strategy = out.get("strategy_args")
    if not isinstance(strategy, dict) or strategy.get("strategy_name") != "sglang":
        return
    config = strategy.setdefault("strategy_config", {})
    gpus = raw.get("num_gpus_per_worker")
    if isinstance(gpus, int) and gpus > 1 and not {"tp_size", "tensor_parallel_size"} & set(config):
        config["tp_size"] = gpus
        top.row(
            f"{path}.strategy_args.strategy_config.tp_size",
            "implemented-as",
            note=f"{gpus}: ROLL's sglang engine spans num_gpus_per_worker GPUs",
        )


def _ulysses(top: _Translator, path: str, raw: dict[str, Any], out: dict[str, Any]) -> None:
    """ROLL's ``model_args.ulysses_size`` -> ``strategy_config.ulysses_size`` of the fsdp2 strategies (ROLL's
    other backends do not read it)."""
    model_args = raw.get("model_args")
    if not isinstance(model_args, dict) or "ulysses_size" not in model_args:
        return
    where, value = f"{path}.model_args.ulysses_size", model_args["ulysses_size"]
    strategy = out.get("strategy_args")
    name = strategy.get("strategy_name") if isinstance(strategy, dict) else None
    if isinstance(strategy, dict) and str(name).startswith("fsdp2"):
        config = strategy.setdefault("strategy_config", {})
        rule = MODEL_ARGS["ulysses_size"]
        if "ulysses_size" in config:
            # given in roll's place too (an override such as the one validate's error names): that one wins
            top.row(where, "ignored", note=f"{path}.{rule.target}={config['ulysses_size']} is given and wins")
            return
        config["ulysses_size"] = 1 if value is None else value
        top.row(where, "renamed", f"{path}.{rule.target}", rule.note)
    else:
        top.row(where, "ignored", note=f"only ROLL's FSDP2 strategies read it; this role runs {name}")


def translate_strategy(top: _Translator, where: str, raw: dict[str, Any]) -> dict[str, Any]:
    """A role's ``strategy_args``: ROLL's strategy name mapped, its ``strategy_config`` keys kept, renamed, passed
    through to the engine or ignored (ROLL's GPU tuning knobs), and ROLL's implicit settings written in."""
    from roll.strategies.registry import STRATEGY_CONFIGS

    name = raw.get("strategy_name")
    mapped, note = STRATEGY_NAMES.get(str(name), (name, ""))
    if mapped is None:
        top.row(f"{where}.strategy_name", "unsupported", note=note)
        return {"strategy_name": name}
    top.row(f"{where}.strategy_name", "renamed" if mapped != name else "kept", str(mapped), note)
    config = raw.get("strategy_config") or {}
    out: dict[str, Any] = {"strategy_name": mapped, "strategy_config": {}}
    try:
        known = set(STRATEGY_CONFIGS.get(str(mapped)).model_fields)
    except Exception:  # an unregistered name: validation names it
        out["strategy_config"] = config
        return out
    if config.get("recompute_granularity") == "full" and "recompute_method" not in config:
        config = {**config, "recompute_method": "uniform", "recompute_num_layers": 1}
        top.row(
            f"{where}.strategy_config.recompute_method",
            "implemented-as",
            note="full recompute without a method: uniform, 1 layer per checkpoint (Megatron's usual)",
        )
    tp = config.get("tensor_model_parallel_size", 1)
    if str(mapped).startswith("megatron") and config.get("sequence_parallel") and tp == 1:
        config = {**config, "sequence_parallel": False}
        top.row(
            f"{where}.strategy_config.sequence_parallel",
            "implemented-as",
            note="false: ROLL (mcore_adapter) turns sequence parallelism off when tensor_model_parallel_size is 1",
        )
    if str(mapped).startswith("megatron") and "transformer_impl" in known and "transformer_impl" not in config:
        out["strategy_config"]["transformer_impl"] = "transformer_engine"
        top.row(
            f"{where}.strategy_config.transformer_impl",
            "implemented-as",
            note="transformer_engine: ROLL's (mcore_adapter's) default, written in",
        )
    passthrough = _STRATEGY_PASSTHROUGH.get(str(mapped))
    for key, value in config.items():
        here = f"{where}.strategy_config.{key}"
        if key in known and key.endswith("dtype") and value in ROLL_DTYPES:
            out["strategy_config"][key] = ROLL_DTYPES[value]
            top.row(here, "renamed", note=f"{value} -> {ROLL_DTYPES[value]}")
        elif key in known:
            out["strategy_config"][key] = value
            top.row(here, "kept")
        elif passthrough:
            out["strategy_config"].setdefault(passthrough, {})[key] = value
            top.row(here, "renamed", f"{where}.strategy_config.{passthrough}.{key}", f"passed to {mapped} as is")
        else:
            top.row(
                here,
                "ignored",
                note=f"{mapped} tuning knob roll's {mapped} strategy does not take "
                "(GPU parallelism/kernels; no effect on the maths)",
            )
    return out
