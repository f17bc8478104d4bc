"""Conformance of every installed backend on one tiny fp32 model: the same weights must give the same answers.

All backends load one HF folder: the ``nano`` tiny Qwen2 with its weights perturbed by seeded noise (random-init
weights give near-uniform logits, so greedy decoding would repeat one token and hide disagreements).

* greedy generation of left-padded prompts equals ``hf_infer``'s (``hf_infer`` itself equals plain transformers);
* log-probs of the same tokens agree within 1e-3 (``forward_step`` + ``ops.log_probs_from_logits`` for the
  logit backends, ``score_tokens`` for vLLM);
* one ``fsdp2_train`` step on 1 or 2 ranks, a weight sync through :class:`ModelUpdateGroup` (every transport, in
  several buckets) into two vLLM workers (one send, two readers), and both then decode what transformers decodes
  from the exported trained weights; a sync that fails midway leaves them refusing to generate until the next
  complete sync;
* a folder written by ``fsdp2`` ``export_hf`` loads in transformers (same logits) and in vLLM (same greedy output);
* selecting a backend whose library is missing, or an unknown name, fails with an actionable error.

In-process strategies and the Ray clusters live in module-scoped fixtures (a vLLM engine takes 20-60 s to start)
and are shut down at the end of the module. Backends whose library is not installed, or that need CUDA on a
machine without it (sglang, megatron), are skipped.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import ray
import torch

from roll.protocol import DataProto, Dispatch, register
from roll.runtime import Cluster, ConfigError, RollError, materialize_all
from roll.runtime.testing import ship_module_by_value
from roll.strategies import (
    STRATEGIES,
    GenerationConfig,
    ModelArgs,
    ModelUpdateGroup,
    StrategyArgs,
    StrategyWorker,
    StrategyWorkerConfig,
    TrainingArgs,
    create_strategy,
)
from roll.strategies.ops import log_probs_from_logits, position_ids_from_attention_mask
from roll.strategies.testing import make_tiny_causal_lm
from roll.strategies.testing.train import SftWorker, sft_batch
from roll.strategies.weight_sync import WeightWriter
from roll.strategies.weights import iter_buckets

# The worker classes below are defined in this test file, which Ray workers cannot import.
ship_module_by_value(__name__)

pytestmark = pytest.mark.usefixtures("isolated_process")

PAD = 3  # the tiny tokenizer's <|pad|>
# Lengths 1..10 so left padding differs per row.
PROMPTS = [[5, 6, 7, 8], [100, 200, 300], [42], [17, 250, 401, 77, 9, 64], [11, 12, 13, 14, 15, 16, 17, 18, 19, 20]]
STEPS = 10
NOISE_STD = 0.2  # on top of the 0.02 init: greedy decoding then picks varied tokens with clear top-2 margins
LOG_PROB_TOL = {"atol": 1e-3, "rtol": 0.0}
LOGIT_TOL = {"atol": 1e-5, "rtol": 0.0}
# 256 KiB buckets: the ~1.7 MB model travels in ~7 buckets that cut through layers (q/k/v of a layer apart).
# ModelUpdateGroup takes megabytes; a fraction is the only way to get several buckets out of a model this small.
SYNC_BUCKET_MB = 0.25
ENVS = {"OMP_NUM_THREADS": "1"}
TRAIN_LR = 2e-2  # Adam's first step moves every weight by ~lr: enough to change greedy outputs


# --- backends ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Backend:
    """How to start one registered backend in-process for these tests."""

    library: str | None  # module whose absence skips the backend
    needs_cuda: bool = False
    # Joins (or creates) the default torch.distributed group; see InProcessBackends.get.
    uses_default_group: bool = False
    strategy_config: dict[str, Any] = field(default_factory=dict)


BACKENDS: dict[str, Backend] = {
    "hf_infer": Backend(library=None),
    "fsdp2_infer": Backend(library="torch.distributed.fsdp", uses_default_group=True),
    # gpu_memory_utilization only matters on a GPU, where other backends share the device with the engine.
    "vllm": Backend(
        library="vllm",
        strategy_config={"max_model_len": 256, "kv_cache_space_gb": 1, "gpu_memory_utilization": 0.3},
    ),
    "sglang": Backend(library="sglang", needs_cuda=True, strategy_config={"mem_fraction_static": 0.3}),
    "megatron_infer": Backend(
        library="megatron.core",
        needs_cuda=True,
        uses_default_group=True,
        strategy_config={"bf16": False, "fp16": False},
    ),
}
# Generating backends compared with hf_infer; logit/scoring backends compared with hf_infer's log-probs.
VLLM = pytest.param("vllm", marks=pytest.mark.extra("vllm"))
GENERATORS = [VLLM, pytest.param("sglang", marks=pytest.mark.gpu)]
SCORERS = ["fsdp2_infer", VLLM, pytest.param("megatron_infer", marks=pytest.mark.gpu)]


def role_config(model: Path, strategy_name: str, name: str | None = None, **overrides: Any) -> StrategyWorkerConfig:
    """A role running ``strategy_name`` on ``model`` in float32 with the backend's test settings."""
    strategy_config = BACKENDS[strategy_name].strategy_config if strategy_name in BACKENDS else {}
    return StrategyWorkerConfig(
        name=name or strategy_name,
        model_args=ModelArgs(model_name_or_path=str(model), dtype="float32"),
        strategy_args=StrategyArgs(strategy_name=strategy_name, strategy_config=strategy_config),
        **overrides,
    )


def library_installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a missing parent package, e.g. "megatron" for "megatron.core"
        return False


class InProcessBackends:
    """Strategies started on first use in this process, shared by the module's tests, shut down in reverse order.

    An in-process vLLM engine adopts an existing default process group and destroys it at shutdown, so vLLM is
    always started before a backend that joins the default group (which then reuses vLLM's single-rank group)
    and shut down after it.
    """

    def __init__(self, model: Path) -> None:
        self.model = model
        self._started: dict[str, Any] = {}

    def get(self, name: str) -> Any:
        backend = BACKENDS[name]
        if backend.library is not None:
            pytest.importorskip(backend.library, reason=f"{name} needs {backend.library}")
        if backend.needs_cuda and not torch.cuda.is_available():
            pytest.skip(f"{name} needs a CUDA device")
        if name not in self._started:
            if backend.uses_default_group and library_installed("vllm"):
                self.get("vllm")
            worker = StrategyWorker(role_config(self.model, name, infer_batch_size=2))
            worker.initialize()
            self._started[name] = worker.strategy
        return self._started[name]

    def close(self) -> None:
        for name in reversed(list(self._started)):
            self._started.pop(name).shutdown()


# --- batches and reference computations ------------------------------------------------------------------------
def left_padded(prompts: list[list[int]]) -> DataProto:
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[PAD] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return DataProto.from_dict({"input_ids": ids, "attention_mask": mask})


def greedy_responses(strategy: Any, prompts: list[list[int]], steps: int = STEPS) -> list[list[int]]:
    """A generating strategy's greedy continuations (ignore_eos: every row has ``steps`` tokens)."""
    config = GenerationConfig(max_new_tokens=steps, temperature=0.0, ignore_eos=True)
    return strategy.generate(left_padded(prompts), config)["responses"].tolist()


def transformers_greedy(model: Any, prompts: list[list[int]], steps: int = STEPS) -> list[list[int]]:
    """Plain transformers, one unpadded prompt at a time: argmax of the last position, ``steps`` times."""
    out = []
    for prompt in prompts:
        ids = list(prompt)
        for _ in range(steps):
            with torch.no_grad():
                ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
        out.append(ids[len(prompt) :])
    return out


def load_transformers(path: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def scoring_batch() -> DataProto:
    """Rows of random tokens with left padding (rows 1-3) and right padding (row 4)."""
    generator = torch.Generator().manual_seed(7)
    ids = torch.randint(4, 512, (5, 16), generator=generator)
    mask = torch.ones_like(ids)
    mask[1, :9] = 0
    mask[2, :13] = 0
    mask[3, :4] = 0
    mask[4, 11:] = 0
    ids = ids.masked_fill(mask == 0, PAD)
    return DataProto.from_dict({"input_ids": ids, "attention_mask": mask})


def scored_positions(mask: torch.Tensor) -> torch.Tensor:
    """Positions with a prefix to condition on: real tokens except each row's first."""
    scored = mask.bool().clone()
    scored[torch.arange(len(mask)), mask.argmax(-1)] = False
    return scored


def next_token_log_probs(micro: DataProto, logits: torch.Tensor) -> dict[str, torch.Tensor]:
    """forward_func: log p(token t | tokens < t) at every position (0 at position 0)."""
    ids = micro.batch["input_ids"].to(logits.device)
    out = torch.zeros(ids.shape, dtype=torch.float32)
    out[:, 1:] = log_probs_from_logits(logits[:, :-1], ids[:, 1:]).cpu()
    return {"log_probs": out}


def backend_log_probs(strategy: Any, batch: DataProto) -> torch.Tensor:
    """(B, T) log-probs of ``batch``'s own tokens from any backend, zero where nothing is scored."""
    if hasattr(strategy, "score_tokens"):  # vLLM returns no logits; it scores tokens instead
        values = strategy.score_tokens(batch)
    else:
        values = strategy.forward_step(batch, next_token_log_probs)["log_probs"]
    return values * scored_positions(batch.batch["attention_mask"])


def conformance_batch(seed: int) -> DataProto:
    """4 unpadded rows of 12 tokens from the whole vocabulary."""
    return sft_batch(4, seed, padded=False, high=512)


# --- Ray workers ------------------------------------------------------------------------------------------------
class FailingWriter(WeightWriter):
    """A rank's weight writer that raises once it reaches tensor ``fail_at`` (when armed)."""

    def __init__(self, inner: WeightWriter, worker: TrainerWorker) -> None:
        self.inner, self.worker = inner, worker
        self.specs, self.writes_shards = inner.specs, inner.writes_shards

    def write(self, start: int, stop: int, out: Any, *, local: bool) -> Any:
        if self.worker.fail_at is not None and start >= self.worker.fail_at:
            self.worker.fail_at = None
            raise RuntimeError("injected failure in the middle of a weight sync")
        return self.inner.write(start, stop, out, local=local)

    def finish(self) -> None:
        self.inner.finish()


class TrainerWorker(SftWorker):
    """An fsdp2_train role: one SFT step, and logits for comparisons."""

    fail_at: int | None = None

    def weight_writer(self) -> WeightWriter:
        return FailingWriter(super().weight_writer(), self)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def fail_next_sync_at(self, tensor_index: int | None) -> None:
        self.fail_at = tensor_index


class RolloutWorker(StrategyWorker):
    """A vllm role that decodes greedily."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def greedy(self, prompts: list[list[int]], steps: int) -> list[list[int]]:
        return greedy_responses(self.strategy, prompts, steps)


# --- fixtures ---------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """The shared fp32 test model: tiny nano weights plus seeded noise, saved with its tokenizer."""
    from transformers import AutoTokenizer

    base = make_tiny_causal_lm(tmp_path_factory.mktemp("conformance") / "nano", preset="nano", seed=0)
    model = load_transformers(base)
    generator = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        for param in model.parameters():  # the tied embedding/lm_head is one parameter
            param.add_(torch.randn(param.shape, generator=generator) * NOISE_STD)
    out = base.parent / "perturbed"
    model.save_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(base)
    assert tokenizer.pad_token_id == PAD
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def reference_model(model_dir):
    return load_transformers(model_dir)


@pytest.fixture(scope="module")
def backends(model_dir) -> Iterator[InProcessBackends]:
    started = InProcessBackends(model_dir)
    yield started
    started.close()


@pytest.fixture(scope="module")
def hf_greedy(backends) -> list[list[int]]:
    return greedy_responses(backends.get("hf_infer"), PROMPTS)


@pytest.fixture(scope="module")
def hf_log_probs(backends) -> torch.Tensor:
    return backend_log_probs(backends.get("hf_infer"), scoring_batch())


@pytest.fixture(scope="module")
def clusters(model_dir, resources, tmp_path_factory) -> Iterator[SimpleNamespace]:
    """fsdp2_train on 2 ranks (gloo), the same on 1 rank, and a 2-worker vllm role started from the 2-rank
    trainer's export.

    The trainer takes one step before exporting, so the exported folder holds weights no file had before; the
    logits and greedy output at that moment are recorded for the export test.
    """
    pytest.importorskip("vllm")
    tag = uuid.uuid4().hex[:6]
    envs = ENVS
    train_config = role_config(
        model_dir,
        "fsdp2_train",
        name=f"conf-train-{tag}",
        world_size=2,
        system_envs=envs,
        infer_batch_size=2,
        training_args=TrainingArgs(learning_rate=TRAIN_LR, per_device_train_batch_size=2),
    )
    train = Cluster(train_config.name, TrainerWorker, resources, train_config)
    one_config = train_config.model_copy(update={"name": f"conf-train1-{tag}", "world_size": 1})
    infer = one_rank = None
    try:
        one_rank = Cluster(one_config.name, TrainerWorker, resources, one_config)
        materialize_all(train.initialize(blocking=False), one_rank.initialize(blocking=False))
        train.train(conformance_batch(seed=1))
        export = tmp_path_factory.mktemp("export") / "hf"
        train.export_hf(str(export))
        export_logits = train.logits(scoring_batch()).batch["logits"]
        infer_config = role_config(export, "vllm", name=f"conf-rollout-{tag}", world_size=2, system_envs=envs)
        infer = Cluster(infer_config.name, RolloutWorker, resources, infer_config)
        infer.initialize()
        export_greedy = infer.greedy(PROMPTS, STEPS)[0]
        yield SimpleNamespace(
            train=train,
            trainers={1: one_rank, 2: train},
            infer=infer,
            export=export,
            export_logits=export_logits,
            export_greedy=export_greedy,
        )
    finally:
        if infer is not None:
            infer.shutdown()
        if one_rank is not None:
            one_rank.shutdown()
        train.shutdown()


# --- a. greedy generation ---------------------------------------------------------------------------------------
def test_model_decodes_varied_tokens(reference_model):
    """Guards the premise of the generation tests: outputs that repeat one token would hide disagreements."""
    outputs = transformers_greedy(reference_model, PROMPTS)
    assert all(len(set(tokens)) >= 4 for tokens in outputs), outputs
    assert len({tuple(tokens) for tokens in outputs}) == len(PROMPTS)


def test_hf_infer_greedy_matches_plain_transformers(hf_greedy, reference_model):
    assert hf_greedy == transformers_greedy(reference_model, PROMPTS)


@pytest.mark.parametrize("name", GENERATORS)
def test_greedy_generation_matches_hf_infer(name, backends, hf_greedy):
    assert greedy_responses(backends.get(name), PROMPTS) == hf_greedy


# --- b. log-probs of the same tokens ----------------------------------------------------------------------------
def test_hf_infer_log_probs_match_plain_transformers(hf_log_probs, reference_model):
    batch = scoring_batch()
    ids, mask = batch.batch["input_ids"], batch.batch["attention_mask"]
    with torch.no_grad():
        logits = reference_model(
            input_ids=ids, attention_mask=mask, position_ids=position_ids_from_attention_mask(mask)
        ).logits
    expected = torch.zeros(ids.shape)
    expected[:, 1:] = log_probs_from_logits(logits[:, :-1], ids[:, 1:])
    torch.testing.assert_close(hf_log_probs, expected * scored_positions(mask), **LOG_PROB_TOL)


@pytest.mark.parametrize("name", SCORERS)
def test_log_probs_match_hf_infer(name, backends, hf_log_probs):
    batch = scoring_batch()
    values = backend_log_probs(backends.get(name), batch)
    assert values.shape == hf_log_probs.shape
    assert hf_log_probs[scored_positions(batch.batch["attention_mask"])].lt(0).all()
    torch.testing.assert_close(values, hf_log_probs, **LOG_PROB_TOL)


@pytest.mark.parametrize("name", ["hf_infer", "fsdp2_infer", pytest.param("megatron_infer", marks=pytest.mark.gpu)])
def test_logits_to_keep_gives_the_last_positions(name, backends):
    """logits_to_keep=k: functions may get only the last k positions, with the same values."""
    strategy, keep = backends.get(name), 4
    full = strategy.forward_step(scoring_batch(), lambda micro, logits: {"logits": logits})["logits"]
    batch = scoring_batch()
    widths: list[int] = []

    def last_positions(micro: DataProto, logits: torch.Tensor) -> dict[str, torch.Tensor]:
        widths.append(logits.shape[1])
        return {"logits": logits[:, -keep:]}

    kept = strategy.forward_step(batch, last_positions, logits_to_keep=keep)["logits"]
    torch.testing.assert_close(kept, full[:, -keep:], **LOGIT_TOL)
    if name != "megatron_infer":  # transformers models compute the head on those positions only
        assert set(widths) == {keep}


# --- c. train step + weight sync --------------------------------------------------------------------------------
def trained_reference(trainer: Cluster, folder: Path) -> Any:
    trainer.export_hf(str(folder))
    return load_transformers(folder)


@pytest.mark.extra("vllm")
@pytest.mark.parametrize("ranks", [1, 2], ids=["1rank", "2ranks"])
@pytest.mark.parametrize("transport", ["shared_memory", "collective", "object_store"])
def test_vllm_decodes_the_trained_weights_after_a_weight_sync(transport, ranks, clusters, tmp_path):
    """One fsdp2 step, a bucketed sync into two vLLM workers: both then decode what transformers decodes from
    the exported trained weights, and no longer what they decoded before the step."""
    trainer = clusters.trainers[ranks]
    before = clusters.infer.greedy(PROMPTS, STEPS)
    seed = {"shared_memory": 2, "collective": 3, "object_store": 4}[transport] + 10 * ranks
    metrics = trainer.train(conformance_batch(seed=seed))
    assert all(m["loss"] == metrics[0]["loss"] > 0 for m in metrics)

    group = ModelUpdateGroup(trainer, clusters.infer, bucket_size_mb=SYNC_BUCKET_MB, transport=transport)
    try:
        sync = group.update(1, force=True)
    finally:
        group.close()
    assert group.transport == transport

    trained = trained_reference(trainer, tmp_path / "trained")
    state = dict(trained.state_dict())
    state.setdefault("lm_head.weight", trained.get_input_embeddings().weight)  # named_weights lists both
    assert len(list(iter_buckets(state.items(), int(SYNC_BUCKET_MB * 2**20)))) >= 4
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    assert sync["weight_sync/bytes"] == sync["weight_sync/received_bytes"] == nbytes
    assert sync["weight_sync/receivers"] == 2

    after = clusters.infer.greedy(PROMPTS, STEPS)
    expected = transformers_greedy(trained, PROMPTS)
    assert after == [expected, expected]
    assert after != before, "the training step should have changed the greedy output"


@pytest.mark.extra("vllm")
@pytest.mark.parametrize("transport", ["shared_memory", "collective"])
def test_a_weight_sync_that_fails_midway_is_loud_and_the_next_one_repairs_vllm(transport, clusters, tmp_path):
    trainer = clusters.trainers[2]
    trainer.train(conformance_batch(seed=40))
    group = ModelUpdateGroup(trainer, clusters.infer, bucket_size_mb=SYNC_BUCKET_MB, transport=transport)
    try:
        trainer.fail_next_sync_at(12)  # half-way through the tensors: some layers loaded, others not
        with pytest.raises(RollError, match="injected failure"):
            group.update(1, force=True)
        with pytest.raises(RollError, match="failed midway|stopped midway"):
            clusters.infer.greedy(PROMPTS, STEPS)
        # Only the rank that raised first is disarmed: the other may have stopped before its own tensor 12.
        trainer.fail_next_sync_at(None)
        group.update(2, force=True)
    finally:
        group.close()
    expected = transformers_greedy(trained_reference(trainer, tmp_path / "trained"), PROMPTS)
    assert clusters.infer.greedy(PROMPTS, STEPS) == [expected, expected]


@pytest.mark.extra("vllm")
def test_two_vllm_engines_sharing_one_copy_decode_the_trained_weights(clusters, resources, tmp_path):
    """Two in-place CPU engines on one node keep one copy of the weights: one loads the sync, both then decode
    what transformers decodes from the trained weights, a failure midway fences both, the next sync repairs both."""
    trainer = clusters.trainers[1]
    config = role_config(
        clusters.export, "vllm", name=f"conf-shared-{uuid.uuid4().hex[:6]}", world_size=2, system_envs=ENVS
    )
    settings = {**BACKENDS["vllm"].strategy_config, "cpu_plain_linear": True, "share_weights_on_node": True}
    config = config.model_copy(update={"strategy_args": StrategyArgs(strategy_name="vllm", strategy_config=settings)})
    infer = Cluster(config.name, RolloutWorker, resources, config)
    group = ModelUpdateGroup(trainer, infer, bucket_size_mb=SYNC_BUCKET_MB, transport="shared_memory")
    try:
        infer.initialize()
        trainer.train(conformance_batch(seed=50))
        sync = group.update(1, force=True)
        assert group.routes.readers == (0,) and group.routes.shares == ((1, 0),)
        assert sync["weight_sync/receivers"] == 2
        expected = transformers_greedy(trained_reference(trainer, tmp_path / "first"), PROMPTS)
        assert infer.greedy(PROMPTS, STEPS) == [expected, expected]

        trainer.train(conformance_batch(seed=51))
        trainer.fail_next_sync_at(12)
        with pytest.raises(RollError, match="injected failure"):
            group.update(2, force=True)
        for worker in infer.workers:
            with pytest.raises(RollError, match="failed midway"):
                ray.get(worker.greedy.remote(PROMPTS, STEPS))
        trainer.fail_next_sync_at(None)
        group.update(3, force=True)
        expected = transformers_greedy(trained_reference(trainer, tmp_path / "second"), PROMPTS)
        assert infer.greedy(PROMPTS, STEPS) == [expected, expected]
    finally:
        group.close()
        infer.shutdown()


# --- d. exported folders ----------------------------------------------------------------------------------------
@pytest.mark.extra("vllm")
def test_exported_folder_loads_in_transformers_with_the_strategys_logits(clusters):
    exported = load_transformers(clusters.export)
    batch = scoring_batch()
    ids, mask = batch.batch["input_ids"], batch.batch["attention_mask"]
    with torch.no_grad():
        logits = exported(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_attention_mask(mask))
    valid = mask.bool()
    torch.testing.assert_close(clusters.export_logits[valid], logits.logits[valid], **LOGIT_TOL)


@pytest.mark.extra("vllm")
def test_exported_folder_loads_in_vllm_with_transformers_greedy_output(clusters, model_dir):
    exported = load_transformers(clusters.export)
    assert clusters.export_greedy == transformers_greedy(exported, PROMPTS)
    # The export holds the trained weights, not the input folder's.
    assert clusters.export_greedy != transformers_greedy(load_transformers(model_dir), PROMPTS)


# --- e. selecting backends --------------------------------------------------------------------------------------
# Runs in a fresh interpreter where `import vllm` fails, through StrategyWorker.initialize -> create_strategy ->
# STRATEGIES.get: the registry's real entry, with nothing resolved yet.
_WITHOUT_VLLM = textwrap.dedent(
    """
    import importlib.abc
    import sys


    class BlockVllm(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "vllm" or name.startswith("vllm."):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None


    sys.meta_path.insert(0, BlockVllm())

    from roll.runtime import MissingExtraError
    from roll.strategies import ModelArgs, StrategyArgs, StrategyWorker, StrategyWorkerConfig

    config = StrategyWorkerConfig(
        name="rollout",
        model_args=ModelArgs(model_name_or_path=sys.argv[1], dtype="float32"),
        strategy_args=StrategyArgs(strategy_name="vllm"),
    )
    try:
        StrategyWorker(config).initialize()
    except MissingExtraError as error:
        print("MissingExtraError:", error)
        assert not any(m == "vllm" or m.startswith("vllm.") for m in sys.modules), "vllm was imported"
    else:
        raise SystemExit("selecting vllm without it did not fail")
    """
)


def test_selecting_vllm_without_vllm_names_the_extra(model_dir):
    result = subprocess.run(
        [sys.executable, "-c", _WITHOUT_VLLM, str(model_dir)], capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "MissingExtraError:" in result.stdout
    assert "pip install 'roll-strategies[vllm]'" in result.stdout


def test_unknown_strategy_name_lists_the_known_ones():
    known = ["fsdp2_infer", "fsdp2_train", "hf_infer", "megatron_infer", "megatron_train", "mock_infer", "sglang"]
    known.append("vllm")
    assert set(known) <= set(STRATEGIES.names())
    # At config validation ...
    with pytest.raises(ConfigError, match="unknown strategy 'vlm'") as info:
        StrategyWorkerConfig(name="rollout", strategy_args=StrategyArgs(strategy_name="vlm"))
    assert all(name in str(info.value) for name in known)
    # ... and in create_strategy, for a config built without validation.
    config = StrategyWorkerConfig.model_construct(name="rollout", strategy_args=StrategyArgs(strategy_name="vlm"))
    with pytest.raises(ConfigError, match="unknown strategy 'vlm'") as info:
        create_strategy(SimpleNamespace(worker_config=config))
    assert all(name in str(info.value) for name in known)
