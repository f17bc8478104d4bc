"""The ``vllm`` backend: one offline ``vllm.LLM`` engine per worker, for generation and in-place weight sync.

Log-probs
    The engine runs with ``logprobs_mode="processed_logprobs"``: ``rollout_log_probs`` are log-probs of the
    distribution each token was actually sampled from - after repetition penalty, temperature, min-p and
    top-k/top-p. Without penalty or truncation (the usual RL setting) that is exactly
    ``log_softmax(logits / temperature)``; vLLM's default ("raw_logprobs") ignores the temperature. Greedy
    decoding (temperature 0) reports ``log_softmax(logits)``.

Stopping
    The response keeps the token that stopped generation: EOS, a ``stop_token_ids`` token, or the token that
    completed a stop string (whose text may run past the string), as HF ``generate`` does.

Scoring instead of logits
    vLLM does not return full logits, so :meth:`VllmStrategy.forward_step` raises :class:`StrategyError`;
    :meth:`VllmStrategy.score_tokens` returns the log-prob of every given token (temperature 1) through
    ``prompt_logprobs``. Use an HF/FSDP2 backend for anything needing logits.

Weight sync
    ``update_weights`` streams each bucket into the engine; ``process_weights_after_loading`` finishes the reload
    and clears the prefix cache. By default vLLM's layerwise reload rebuilds each layer once all its tensors
    arrived, including its post-load processing (on CPU: the oneDNN weight repack), see ``_reload``; with
    ``cpu_plain_linear`` the CPU engine keeps plain weights and each tensor is copied in place (``_inplace``).
    Bucket tensors are views of a reused transfer slot: whatever the engine keeps past a call is copied.
    Tensors are handed to the engine directly, which needs the engine core in this process (``in_process``,
    default on); verified on CPU with TP=1.

Over several nodes
    A worker the runtime placed over several nodes (``worker.nodes`` has more than one entry; ROLL's
    ``tensor_parallel_size: 16`` on 8-GPU nodes) runs vLLM's multi-node mode: the engine core stays in this worker
    and its TP x PP ranks are Ray actors, one per device, inside each node's reservation (``_nodes`` plans them,
    ``_ray_executor`` starts them). Weight sync then reaches the ranks through vLLM's ``collective_rpc`` over Ray.
    Needs a multi-node GPU cluster; not run in roll's CI.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any, cast

import torch

from roll.protocol import DataProto
from roll.runtime import ConfigError
from roll.strategies.base import InferenceStrategy
from roll.strategies.config import GenerationConfig
from roll.strategies.contract import ForwardFunc, OffloadTarget, StrategyError
from roll.strategies.generation import build_generation_output, prompt_token_lists, sample_seeds
from roll.strategies.vllm import _inplace, _nodes, _reload
from roll.strategies.vllm._sampling import (
    build_requests,
    parse_completions,
    parse_prompt_logprobs,
    request_errors,
    scoring_params,
)
from roll.strategies.vllm.config import VllmConfig, cpu_block_size

__all__ = ["VllmStrategy"]

# vLLM itself is imported when the engine starts (after its environment is set); failing here instead lets the
# registry report the missing extra with its pip command.
if importlib.util.find_spec("vllm") is None:
    raise ModuleNotFoundError("No module named 'vllm'", name="vllm")

logger = logging.getLogger(__name__)

_SLEEP_TAGS = {OffloadTarget.MODEL_PARAMS: "weights", OffloadTarget.KV_CACHE: "kv_cache"}


@contextlib.contextmanager
def _keep_torch_threads() -> Iterator[None]:
    """Undo process-wide thread changes an in-process engine makes while starting.

    vLLM's CPU worker replaces ``torch.set_num_threads`` with a no-op and drops torch to one thread (both meant
    for a process of its own); in-process they would also throttle and freeze everything else's threading.
    """
    set_num_threads, num_threads = torch.set_num_threads, torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_num_threads = set_num_threads
        torch.set_num_threads(num_threads)


class VllmStrategy(InferenceStrategy):
    """Generation, token scoring and weight sync on a vLLM engine (see the module docstring)."""

    strategy_name = "vllm"
    config: VllmConfig

    def __init__(self, worker: Any, config: VllmConfig) -> None:
        super().__init__(worker, config)
        self.llm: Any = None
        self._tied_embeddings = False
        self._asleep: set[str] = set()
        # Set between the first bucket of a weight sync and process_weights_after_loading.
        self._reload_params: set[str] | None = None
        self._reload_loaded: set[str] = set()
        self._reload_aborted = False  # the sync in progress stopped midway: the next bucket starts a new one
        self._in_place = False  # weights are copied into the live parameters (see _inplace)

    # --- lifecycle --------------------------------------------------------------------------------------
    def initialize(self) -> None:
        if not self.model_args.model_name_or_path:
            raise ConfigError(
                f"{self.worker_config.name}.model_args.model_name_or_path is not set (vllm needs a model)"
            )
        on_gpu = torch.cuda.is_available()
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            # vLLM adopts an existing default group instead of creating its own, and destroys it at shutdown.
            logger.warning("torch.distributed is already initialized; the vLLM engine will use and later destroy it")
        self._set_engine_env(on_gpu)
        from vllm import LLM

        plain = self.config.cpu_plain_linear and not on_gpu
        kwargs = self._engine_kwargs(on_gpu)
        if len(getattr(self.worker, "nodes", ())) > 1:
            kwargs.update(self._multi_node_kwargs())
        with _keep_torch_threads(), _inplace.plain_cpu_linears() if plain else contextlib.nullcontext():
            self.llm = LLM(**kwargs)
        self.tokenizer = self.llm.get_tokenizer()
        self.device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
        text_config = self.llm.llm_engine.model_config.hf_config.get_text_config()
        self._tied_embeddings = bool(getattr(text_config, "tie_word_embeddings", False))
        if plain:
            reasons = self._rpc(_inplace.in_place_ready)
            self._in_place = not reasons
            if reasons:
                logger.info("weight sync reloads layer by layer: %s", "; ".join(reasons))
            else:
                self._rpc(_inplace.align_parameters)
        logger.info("vLLM engine ready: %s on %s", self.model_args.model_name_or_path, self.device)

    def _set_engine_env(self, on_gpu: bool) -> None:
        """Environment vLLM reads while building the engine; this worker process is the engine's own."""
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0" if self.config.engine_in_process else "1"
        if not on_gpu:
            os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(self.config.kv_cache_space_gb)
        # vLLM logs every engine step at INFO; keep a worker's console readable unless the user asked for more.
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        envs = sys.modules.get("vllm.envs")
        if envs is not None and hasattr(envs, "disable_envs_cache"):
            envs.disable_envs_cache()  # an earlier engine in this process froze the values it read

    def _engine_kwargs(self, on_gpu: bool) -> dict[str, Any]:
        cfg, args = self.config, self.model_args
        kwargs: dict[str, Any] = {
            "model": args.model_name_or_path,
            "tokenizer": args.tokenizer_path,
            "dtype": args.dtype,
            "trust_remote_code": args.trust_remote_code,
            "tensor_parallel_size": cfg.tensor_parallel_size,
            "pipeline_parallel_size": cfg.pipeline_parallel_size,
            "gpu_memory_utilization": cfg.gpu_memory_utilization,
            "enforce_eager": (not on_gpu) if cfg.enforce_eager is None else cfg.enforce_eager,
            "enable_prefix_caching": cfg.enable_prefix_caching,
            "enable_sleep_mode": cfg.enable_sleep_mode and on_gpu,
            "seed": cfg.seed,
            "load_format": cfg.load_format,
            "logprobs_mode": "processed_logprobs",
        }
        if args.model_config_kwargs:
            kwargs["hf_overrides"] = dict(args.model_config_kwargs)
        if cfg.max_model_len is not None:
            kwargs["max_model_len"] = cfg.max_model_len
        if cfg.max_num_seqs is not None:
            kwargs["max_num_seqs"] = cfg.max_num_seqs
        if not on_gpu:
            # After a step that prefilled part of a prompt, vLLM rewinds that request's seeded generator, which a CPU
            # torch.Generator cannot do ("CPU Generator does not use offset"): on CPU every prompt is prefilled whole
            # (vLLM then raises max_num_batched_tokens to max_model_len if it is below it).
            kwargs["enable_chunked_prefill"] = False
            return cpu_block_size({**kwargs, **cfg.engine_kwargs})
        return {**kwargs, **cfg.engine_kwargs}

    def _multi_node_kwargs(self) -> dict[str, Any]:
        """Engine arguments of a worker placed over several nodes: roll's Ray executor over the planned ranks."""
        ranks = _nodes.engine_ranks(self.config, self.worker.nodes)
        from roll.strategies.vllm._ray_executor import executor_for  # imports vLLM's Ray executor: GPU runs only

        logger.info(
            "vLLM engine over %d nodes: %d ranks (tp %d x pp %d)",
            len(self.worker.nodes),
            len(ranks),
            self.config.tensor_parallel_size,
            self.config.pipeline_parallel_size,
        )
        return _nodes.multi_node_engine_kwargs(self.config, executor_for(ranks))

    def shutdown(self) -> None:
        if self.llm is None:
            return
        llm, self.llm = self.llm, None
        # Tears down the engine's process group and undoes its gc.freeze(), which matter in-process.
        llm.llm_engine.engine_core.shutdown()
        del llm

    # --- compute ----------------------------------------------------------------------------------------
    def _engine(self) -> Any:
        if self.llm is None:
            raise StrategyError("the vllm strategy is not initialized (or was shut down); call initialize() first")
        if self._reload_aborted:
            raise StrategyError(
                "the last weight sync stopped midway and left the engine's weights partly updated; run a complete "
                "weight sync before generating"
            )
        if self._reload_params is not None:
            raise StrategyError("a weight sync is in progress; call process_weights_after_loading() to finish it")
        if self._asleep:
            raise StrategyError(f"the vLLM engine is offloaded ({sorted(self._asleep)}); call load_states() first")
        return self.llm

    def _run(self, requests: list[dict[str, list[int]]], params: Any) -> list[Any]:
        try:
            return self._engine().generate(requests, params, use_tqdm=False)
        except request_errors() as e:  # e.g. a prompt longer than max_model_len
            raise StrategyError(f"vLLM rejected the request: {e}") from e

    def generate(self, batch: DataProto, generation_config: GenerationConfig) -> DataProto:
        prompts = prompt_token_lists(batch)
        empty = [row for row, prompt in enumerate(prompts) if not prompt]
        if empty:
            raise StrategyError(f"rows {empty} have an empty prompt (attention_mask all 0); vLLM needs >= 1 token")
        requests, params = build_requests(prompts, generation_config, sample_seeds(batch, generation_config))
        samples = parse_completions(self._run(requests, params), generation_config.logprobs)
        return build_generation_output(
            batch,
            [tokens for tokens, _, _ in samples],
            # parse_completions fills every sample's log-probs when asked for them.
            [cast("list[float]", log_probs) for _, log_probs, _ in samples] if generation_config.logprobs else None,
            [reason for _, _, reason in samples],
            num_return_sequences=generation_config.num_return_sequences,
            max_new_tokens=generation_config.max_new_tokens,
            pad_token_id=self._pad_token_id(),
        )

    def _pad_token_id(self) -> int:
        for candidate in (getattr(self.tokenizer, "pad_token_id", None), getattr(self.tokenizer, "eos_token_id", None)):
            if candidate is not None:
                return int(candidate)
        return 0

    def score_tokens(self, batch: DataProto) -> torch.Tensor:
        """log p(token_t | earlier tokens of its row) for ``batch``'s ``input_ids``, shape (B, T), float32.

        Only positions where ``attention_mask`` is 1 are scored (as one sequence per row); the first of them and
        every masked position get 0. Log-probs are at temperature 1 (vLLM's prompt log-probs are never scaled).
        """
        ids, mask = batch.batch["input_ids"], batch.batch["attention_mask"].bool()
        rows = prompt_token_lists(batch)
        scored = [row for row, tokens in enumerate(rows) if len(tokens) > 1]
        out = torch.zeros(ids.shape, dtype=torch.float32)
        if not scored:
            return out
        outputs = self._run([{"prompt_token_ids": rows[row]} for row in scored], scoring_params())
        for row, output in zip(scored, outputs):
            values = parse_prompt_logprobs(output, rows[row])
            out[row, mask[row].cpu()] = torch.tensor(values, dtype=torch.float32)
        return out

    def forward_step(
        self, batch: DataProto, forward_func: ForwardFunc, *, logits_to_keep: int | None = None
    ) -> dict[str, torch.Tensor]:
        raise StrategyError(
            "vllm cannot return logits for forward_step: use VllmStrategy.score_tokens(batch) for the log-probs "
            "of given tokens, or an hf_infer / fsdp2_infer role for anything that needs logits"
        )

    # --- device memory ----------------------------------------------------------------------------------
    def _sleep_supported(self) -> bool:
        if self.llm is not None and self.config.enable_sleep_mode and self.device.type == "cuda":
            return True
        logger.debug("vllm offload/load is a no-op (needs enable_sleep_mode on CUDA; device is %s)", self.device)
        return False

    def offload_states(self, include: Iterable[OffloadTarget] | None = None) -> None:
        """Put the engine to sleep (weights and KV cache together: vLLM cannot offload only one of them)."""
        targets = set(OffloadTarget) if include is None else set(include)
        if not targets & set(_SLEEP_TAGS) or self._asleep or not self._sleep_supported():
            return
        self.llm.sleep(level=self.config.sleep_level)
        self._asleep = set(_SLEEP_TAGS.values())

    def load_states(self, include: Iterable[OffloadTarget] | None = None) -> None:
        """Wake the requested parts up; the engine serves again once weights and KV cache are both back."""
        targets = set(OffloadTarget) if include is None else set(include)
        tags = {_SLEEP_TAGS[t] for t in targets if t in _SLEEP_TAGS} & self._asleep
        if not tags or not self._sleep_supported():
            return
        self.llm.wake_up(tags=sorted(tags))
        self._asleep -= tags

    # --- weights in -------------------------------------------------------------------------------------
    def _rpc(self, method: Callable[..., Any], *args: Any) -> Any:
        """Run ``method(vllm_worker, *args)`` in every engine worker; the first worker's result."""
        return self.llm.collective_rpc(method, args=args)[0]

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        if self.llm is None:
            raise StrategyError("the vllm strategy is not initialized; call initialize() before a weight sync")
        if not self.config.engine_in_process:
            raise StrategyError("vllm receives weights only with the engine in-process; set in_process: true")
        items = list(named_tensors)
        if not items:
            return
        if "weights" in self._asleep:
            logger.info("waking vLLM weights up to receive a weight sync")
            self.load_states([OffloadTarget.MODEL_PARAMS])
        if self._reload_params is None or self._reload_aborted:
            begin = _inplace.parameter_names if self._in_place else _reload.begin_reload
            self._reload_params = set(self._rpc(begin))
            self._reload_loaded = set()
            self._reload_aborted = False
        if self._tied_embeddings:
            items = _reload.with_tied_lm_head(items)
        load = _inplace.load_in_place if self._in_place else _reload.load_bucket
        self._reload_loaded.update(self._rpc(load, items))

    def weight_share_key(self) -> tuple[str, int] | None:
        """Engines of one node can share one copy of their weights when they load in place, run one worker
        each (no tensor/pipeline parallelism) and ``share_weights_on_node`` is on."""
        if self.llm is None or not (self._in_place and self.config.share_weights_on_node):
            return None
        if self.config.devices_per_worker != 1:
            return None
        key = self._rpc(_inplace.share_layout)
        return None if key is None else (str(key[0]), int(key[1]))

    def share_weights(self, path: str, offset: int, *, fill: bool) -> None:
        if self.weight_share_key() is None:
            raise StrategyError("this vllm engine cannot share its weights (see weight_share_key)")
        self._rpc(_inplace.share_parameters, path, offset, fill)
        self.llm.reset_prefix_cache()

    def abort_weight_update(self) -> None:
        """Drop what a failed sync buffered; the engine refuses to generate until a complete sync."""
        if self.llm is None or self._reload_params is None:
            return
        if not self._in_place:
            self._rpc(_reload.abort_reload)
        self._reload_aborted = True

    def process_weights_after_loading(self) -> None:
        if self.llm is None:
            raise StrategyError("the vllm strategy is not initialized; nothing to finish")
        if self._reload_aborted:
            raise StrategyError("the weight sync stopped midway; send every bucket again before finishing it")
        if self._reload_params is not None:
            self._rpc(_reload.reset_after_reload if self._in_place else _reload.finish_reload)
            missing = sorted(self._reload_params - self._reload_loaded)
            self._reload_params = None
            if missing:
                logger.warning("weight sync kept the old values of %d parameters: %s", len(missing), missing[:8])
        # Cached KV blocks were computed with the old weights.
        if not self._asleep:
            self.llm.reset_prefix_cache()
