"""A non-model roll application: filter a text corpus on several CPU workers.

Pipeline -> Cluster -> Worker, no Strategy: each worker tokenizes its shard of a batch and decides which
documents to keep; the driver streams batches through the cluster and writes the kept documents. It needs only
roll-runtime (no torch): the batches hold non-tensor columns.

    python packages/roll-runtime/examples/text_filter.py --docs 5000 --workers 4 --output kept.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
import re
import string
import time
from pathlib import Path

import numpy as np

from roll.runtime import Cluster, DataProto, Dispatch, ResourceManager, RollModel, Worker, WorkerConfig, init, register

_WORD = re.compile(r"[A-Za-z]+")


class FilterRules(RollModel):
    min_words: int = 5
    max_words: int = 200
    max_symbol_ratio: float = 0.3


class TextFilterWorker(Worker):
    """Scores and filters the documents of its shard."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def initialize(self, settings: FilterRules | None = None) -> None:
        super().initialize(settings)
        self.rules = settings or FilterRules()

    @register(dispatch_mode=Dispatch.DP_MP_COMPUTE)
    def process(self, data: DataProto) -> DataProto:
        words, keep, reasons = [], [], []
        for text in data.non_tensor_batch["text"]:
            n_words = len(_WORD.findall(text))
            symbols = sum(1 for ch in text if ch in string.punctuation) / max(len(text), 1)
            reason = ""
            if n_words < self.rules.min_words:
                reason = "too_short"
            elif n_words > self.rules.max_words:
                reason = "too_long"
            elif symbols > self.rules.max_symbol_ratio:
                reason = "symbols"
            words.append(n_words)
            keep.append(not reason)
            reasons.append(reason)
        data.non_tensor_batch["num_words"] = np.array(words, dtype=np.int64)
        data.non_tensor_batch["keep"] = np.array(keep, dtype=bool)
        data.non_tensor_batch["drop_reason"] = reasons
        data.meta_info["metrics"] = {"kept": sum(keep), "seen": len(keep)}
        return data


class TextFilterPipeline:
    def __init__(self, num_workers: int, rules: FilterRules) -> None:
        init()
        self.resource_manager = ResourceManager()
        config = WorkerConfig(name="text_filter", worker_cls=TextFilterWorker, world_size=num_workers)
        self.filter = Cluster(config.name, TextFilterWorker, self.resource_manager, config)
        # Typed handle: a type checker checks process()'s arguments against TextFilterWorker.process.
        self.process = self.filter.method(TextFilterWorker.process)
        self.filter.initialize(rules)

    def run(self, documents: list[str], batch_size: int, output: Path) -> dict[str, int]:
        counts: dict[str, int] = {"seen": 0, "kept": 0}
        with output.open("w") as sink:
            for start in range(0, len(documents), batch_size):
                batch = DataProto.from_dict(non_tensors={"text": documents[start : start + batch_size]})
                result = self.process(batch)
                for text, keep, reason in zip(result["text"], result["keep"].tolist(), result["drop_reason"]):
                    counts["seen"] += 1
                    if keep:
                        counts["kept"] += 1
                        sink.write(json.dumps({"text": text}) + "\n")
                    else:
                        counts[reason] = counts.get(reason, 0) + 1
        return counts

    def shutdown(self) -> None:
        self.filter.shutdown()


def synthetic_corpus(num_docs: int, seed: int = 0) -> list[str]:
    """Mostly ordinary sentences, with some too-short, too-long and symbol-heavy documents mixed in."""
    rng = random.Random(seed)
    vocabulary = ["ray", "worker", "cluster", "batch", "token", "model", "reward", "policy", "value", "step"]
    docs = []
    for i in range(num_docs):
        kind = i % 10
        if kind == 0:
            docs.append(" ".join(rng.choices(vocabulary, k=2)))
        elif kind == 1:
            docs.append(" ".join(rng.choices(vocabulary, k=300)))
        elif kind == 2:
            docs.append("#!" * 40 + " ".join(rng.choices(vocabulary, k=6)))
        else:
            docs.append(" ".join(rng.choices(vocabulary, k=rng.randint(6, 60))) + ".")
    return docs


def main(argv: list[str] | None = None) -> dict[str, int]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=5000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--output", type=Path, default=Path("kept.jsonl"))
    args = parser.parse_args(argv)
    pipeline = TextFilterPipeline(args.workers, FilterRules())
    try:
        start = time.perf_counter()
        counts = pipeline.run(synthetic_corpus(args.docs), args.batch_size, args.output)
        elapsed = time.perf_counter() - start
    finally:
        pipeline.shutdown()
    print(f"kept {counts['kept']}/{counts['seen']} documents in {elapsed:.2f} s -> {args.output}; {counts}")
    return counts


if __name__ == "__main__":
    main()
