"""ROLL's LLM-as-judge reward domains in roll's shape: their sampling settings and ROLL's judge-server mode.

ROLL's ``LLMJudgeRewardWorker`` generates with its domain's ``generating_args``; roll's ``llm_judge`` reward takes
them from ``reward_kwargs`` (``max_new_tokens``, ``temperature``, the rest under ``generation``), so they move there.
ROLL's named ``judge_prompt`` (and its yes/no reading of the answer) is ``reward_kwargs.prompt_style:
ROLL/<name>``; a domain without one (or with a name ROLL's table lacks) gets ``ROLL/default``, ROLL's fallback.

``judge_model_type: cluster`` (ROLL commit bd17364f, the mode the ``*_llm_as_judge_server.yaml`` example is written
for): a top-level ``reward_model`` role (an ``InferWorker`` on vLLM) serves the judge on its own GPUs behind a router,
and the domain's reward workers are CPU clients that render the judge prompt with ``reward_model``'s tokenizer and
template and send each row as a request with the domain's ``generating_args``. roll's judge workers serve the judge
themselves: the domain takes ``reward_model``'s model, strategy and devices, so the judge model still runs on its own
cluster (those devices), one replica per worker, and rows are split over the replicas by roll's dispatch instead of
ROLL's router. Scores are the same function of the same model and sampling settings; only the ``world_size`` of CPU
clients has no counterpart (there are no clients).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from roll.pipelines.compat.keys import ROLL_SAMPLING_DEFAULTS

if TYPE_CHECKING:
    from roll.pipelines.compat.translate import _Translator

__all__ = ["fold_judges"]

_SERVED = ("model_args", "strategy_args", "device_mapping", "num_gpus_per_worker")
_OWN_KWARGS = ("max_new_tokens", "temperature")
# ROLL's GeneratingArguments defaults (roll/configs/generating_args.py) for what a judge's generating_args leave out
ROLL_GENERATION_DEFAULTS: dict[str, float | int] = {"max_new_tokens": 8192, **ROLL_SAMPLING_DEFAULTS}


def _is_judge(domain: Any) -> bool:
    return isinstance(domain, dict) and str(domain.get("worker_cls") or "").endswith("LLMJudgeRewardWorker")


def fold_judges(top: _Translator, data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with every LLM-judge domain in roll's shape and ``reward_model`` folded into its cluster-mode judge."""
    rewards = data.get("rewards")
    if top.pipeline != "rlvr" or not isinstance(rewards, dict):
        return data
    judges = {name: dict(domain) for name, domain in rewards.items() if _is_judge(domain)}
    served = [name for name, domain in judges.items() if domain.get("judge_model_type") == "cluster"]
    out = dict(data)
    if "reward_model" in data:
        server = out.pop("reward_model")
        if _server_usable(top, server, served):
            _fold_server(top, served[0], judges[served[0]], server)
    elif served:
        for name in served:
            top.row(
                f"rewards.{name}.judge_model_type",
                "unsupported",
                note="'cluster' needs a top-level reward_model role serving the judge (ROLL raises ValueError too)",
            )
    for name, domain in judges.items():
        if not _api_mode(top, name, domain):
            _sampling_to_kwargs(top, name, domain)
        _prompt_style(top, name, domain)
    out["rewards"] = {**rewards, **judges}
    return out


def _server_usable(top: _Translator, server: Any, served: list[str]) -> bool:
    if not served:
        top.row(
            "reward_model",
            "ignored",
            note="no reward domain has judge_model_type: cluster; ROLL starts this cluster but sends it no request",
        )
        return False
    if not isinstance(server, dict) or not server.get("device_mapping"):
        top.row(
            "reward_model",
            "unsupported",
            note="judge_model_type: cluster needs reward_model.device_mapping (ROLL starts no judge cluster without)",
        )
        return False
    if len(served) > 1:
        top.row(
            "reward_model",
            "unsupported",
            note=f"domains {served} share one judge cluster in ROLL; roll serves a judge per domain: give each "
            "domain judge_model_type: inference with its own model_args, strategy_args and device_mapping",
        )
        return False
    return True


def _fold_server(top: _Translator, name: str, domain: dict[str, Any], server: dict[str, Any]) -> None:
    path = f"rewards.{name}"
    domain.pop("judge_model_type", None)
    top.row(
        f"{path}.judge_model_type",
        "implemented-as",
        path,
        "'cluster': the judge model is served on reward_model's devices by this domain's own workers",
    )
    for key in _SERVED:
        if key in domain:
            note = "replaced by reward_model's: in ROLL's cluster mode the judge client uses the served model's"
            top.row(f"{path}.{key}", "ignored", note=note)
            domain.pop(key)
    if "world_size" in domain:
        top.row(
            f"{path}.world_size",
            "ignored",
            note=f"{domain.pop('world_size')!r} CPU clients of ROLL's judge router; roll's judge workers are the "
            "served replicas themselves (one per reward_model device group)",
        )
    for key, value in server.items():
        where = f"reward_model.{key}"
        if key == "name":
            top.row(where, "ignored", note="the name of ROLL's judge cluster and router actor")
        elif key == "worker_cls":
            top.row(where, "implemented-as", path, "ROLL's InferWorker serving the judge: roll's judge workers")
        elif key == "generating_args":
            top.row(where, "ignored", note=f"ROLL's judge client sends {path}.generating_args with each request")
        elif key == "data_args":  # the client renders the judge prompt with reward_model's template
            domain[key] = value
            top.row(where, "renamed", f"{path}.{key}", "ROLL's judge client renders prompts with this template")
        else:
            domain[key] = value
            top.row(where, "renamed", f"{path}.{key}")


def _api_mode(top: _Translator, name: str, domain: dict[str, Any]) -> bool:
    """ROLL's ``judge_model_type: api`` (its default) with a ``judge_api_url``: roll's ``llm_judge_api`` reward, the
    URL, key and model name in its reward_kwargs; the domain's model, strategy and sampling are not used (ROLL's API
    judge sends the model name and the messages only). Without a URL ROLL's api judge fails at its first request:
    roll's judge then serves the domain's model itself, as before."""
    if domain.get("judge_model_type", "api") != "api" or not domain.get("judge_api_url"):
        return False
    path = f"rewards.{name}"
    kwargs = domain.setdefault("reward_kwargs", {})
    for key, target in (("judge_api_url", "api_url"), ("judge_api_key", "api_key"), ("judge_model_name", "model")):
        if key in domain:
            kwargs[target] = domain.pop(key)
            top.row(f"{path}.{key}", "renamed", f"{path}.reward_kwargs.{target}")
    domain.pop("worker_cls", None)
    domain["reward_type"] = "llm_judge_api"
    note = "'api': roll's llm_judge_api reward (an OpenAI-compatible chat API; no judge model in the run)"
    top.row(f"{path}.judge_model_type", "implemented-as", f"{path}.reward_type", note)
    domain.pop("judge_model_type", None)
    for key in (*_SERVED, "generating_args", "data_args"):
        if key in domain:
            domain.pop(key)
            top.row(f"{path}.{key}", "ignored", note="ROLL's API judge sends the model name and the messages only")
    return True


def _sampling_to_kwargs(top: _Translator, name: str, domain: dict[str, Any]) -> None:
    """ROLL's judge generates with the domain's generating_args; roll's reads reward_kwargs."""
    from roll.pipelines.compat.keys import GENERATING_ARGS
    from roll.strategies import GenerationConfig

    generation = domain.pop("generating_args", None)
    if not isinstance(generation, dict):
        return
    kwargs = domain.setdefault("reward_kwargs", {})
    for key, value in generation.items():
        where = f"rewards.{name}.generating_args.{key}"
        if key in _OWN_KWARGS:
            kwargs[key] = value
            top.row(where, "renamed", f"rewards.{name}.reward_kwargs.{key}", "the judge's sampling setting")
        elif key == "num_return_sequences":
            top.row(where, "ignored", note="ROLL's judge reads the first answer; roll's asks for one")
        elif key == "do_sample":
            if value is False:
                kwargs["temperature"] = 0.0
            top.row(where, "implemented-as", f"rewards.{name}.reward_kwargs.temperature", "false: 0 (greedy)")
        elif key in GENERATING_ARGS:
            rule = GENERATING_ARGS[key]
            if not top.apply_rule(where, rule, value):
                top.row(where, rule.status, rule.target or "", rule.note)
        elif key in GenerationConfig.model_fields:
            kwargs.setdefault("generation", {})[key] = value
            top.row(where, "renamed", f"rewards.{name}.reward_kwargs.generation.{key}")
        else:
            top.row(where, "unsupported", note=f"roll's judge has no generation setting {key!r} (got {value!r})")
    for key, default in ROLL_GENERATION_DEFAULTS.items():
        target = kwargs if key in _OWN_KWARGS else kwargs.get("generation", {})
        if key in generation or key in target or (key in ("top_p", "top_k") and kwargs.get("temperature") == 0.0):
            continue  # given (greedy decoding ignores top_p / top_k)
        (kwargs if key in _OWN_KWARGS else kwargs.setdefault("generation", {}))[key] = default
        where = f"(rewards.{name}.generating_args.{key})"
        top.row(where, "implemented-as", f"rewards.{name}.reward_kwargs", f"ROLL default {default!r} written in")


def _prompt_style(top: _Translator, name: str, domain: dict[str, Any]) -> None:
    """ROLL's judge_prompt (a name in ROLL's prompt table) as roll's reward_kwargs.prompt_style ROLL/<name>."""
    from roll.pipelines.rewards.judge_styles import ROLL_JUDGE_PROMPTS, ROLL_STYLE_PREFIX

    kwargs = domain.setdefault("reward_kwargs", {})
    target = f"rewards.{name}.reward_kwargs.prompt_style"
    if "prompt_style" in kwargs:  # a roll-format domain that chose its style already
        if "judge_prompt" in domain:
            top.row(f"rewards.{name}.judge_prompt", "ignored", note=f"{target} is given and wins")
            domain.pop("judge_prompt")
        return
    given = domain.pop("judge_prompt", None)
    if given is None:
        kwargs["prompt_style"] = f"{ROLL_STYLE_PREFIX}default"
        note = "ROLL's built-in judge prompt (judge_prompt unset) with its yes/no reading of the answer, written in"
        top.row(f"(rewards.{name}.judge_prompt)", "implemented-as", target, note)
    elif str(given) in ROLL_JUDGE_PROMPTS and str(given) != "default":
        kwargs["prompt_style"] = f"{ROLL_STYLE_PREFIX}{given}"
        note = "ROLL's named judge template; the answer scores 1 if it contains 'yes', else 0 (ROLL's rule)"
        top.row(f"rewards.{name}.judge_prompt", "implemented-as", target, note)
    else:
        kwargs["prompt_style"] = f"{ROLL_STYLE_PREFIX}default"
        known = sorted(key for key in ROLL_JUDGE_PROMPTS if key != "default")
        note = f"{given!r} is not in ROLL's prompt table {known}: ROLL falls back to its built-in prompt, as here"
        top.row(f"rewards.{name}.judge_prompt", "implemented-as", target, note)
