"""Benchmark of roll.protocol.DataProto on an RLVR-shaped batch, with baselines measured in the same run.

    ./tools/dev bench protocol                  # full run: 4096 rows x 2048 tokens, verl side included
    ./tools/dev bench protocol --quick          # smoke run: tiny sizes, 2 reps, no verl
    ./tools/dev bench protocol --rows 1024 --seq 512 --no-verl

The batch (per row): ``input_ids``, ``attention_mask``, ``position_ids`` int64 [seq]; ``responses`` int64
[resp] (the last ``resp`` tokens of ``input_ids``; resp = seq / 2 by default); ``old_log_probs``,
``advantages`` float32 [resp]; ``prompt`` a distinct ~2 KB string; ``tool_calls`` a list of 0-3 dicts
``{"name": str, "turn": int, "score": float}``.

Operations timed (warm-up, then ``--reps`` repetitions; median and p90 reported): chunk(8), concat of 8
independent parts, select_idxs (random half of the rows), repeat(8, interleave=True), pickle round trip in band
(``pickle.dumps``/``loads``, default protocol) and out of band (protocol 5, ``buffer_callback``), and a Ray
round trip through an actor (``ray.put`` -> actor method gets the batch as an ObjectRef argument -> checksum;
and the same with the actor returning the batch).

Baselines in the same run: ``np.copyto`` / ``np.concatenate`` / ``torch.cat`` of the same bytes (memcpy
bandwidth), a copying chunk (chunk + clone of each part), verl 0.9.1's DataProto (run as a subprocess in its own
venv under tools/.cache/venv-verl, created here on first use), and the prompt strings as a numpy object array.
Minor page faults per operation are reported next to the times: on this kind of VM first-touching a fresh buffer
costs more than copying into it. roll's concat reuses the memory of freed outputs (the steady state of a training
loop); it is also timed with that cache emptied before each call (fresh buffers). A subprocess probe reruns
concat / select_idxs / repeat with ``THP_MEM_ALLOC_ENABLE=1`` (torch's allocator then asks for transparent huge pages) to show that share.

The last stdout line is ``RESULT {json}``. This module is also the verl side: ``--verl-side`` (run by the main
process with the verl venv's python) times the same operations on verl's DataProto and prints its own RESULT.
"""

from __future__ import annotations

import argparse
import copy
import functools
import gc
import importlib
import itertools
import os
import pickle
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from tools.bench._measure import (
    environment,
    freeze_heap,
    gc_disabled,
    measure,
    minor_faults,
    peak_rss_mib,
    summarize,
)
from tools.bench._report import add_report_arguments, emit_result, fmt_bytes, fmt_rate, fmt_seconds, table
from tools.bench._sides import module_command, run_json_subprocess, run_verl_side

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

# torch is imported when the benchmark runs (first thing in main and in each side), so that --help answers at once
if TYPE_CHECKING:
    import torch

CHUNKS = 8
REPEAT = 8

TARGETS = {
    "chunk_vs_copying_chunk": 100.0,  # roll chunk >= 100x faster than a copying chunk
    "concat_vs_memcpy": 0.60,  # roll concat bandwidth >= 60% of memcpy bandwidth
    "ray_vs_verl": 3.0,  # Ray round trip >= 3x faster than verl's default path
    "strings_vs_object_array": 5.0,  # Arrow string column pickles >= 5x faster than a numpy object array
}


# --- the batch ------------------------------------------------------------------------------------------------
def make_raw_batch(rows: int, seq: int, resp: int, prompt_chars: int, seed: int = 0) -> dict[str, Any]:
    """Deterministic RLVR-shaped data as plain torch tensors and Python lists (no DataProto yet)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    input_ids = torch.randint(0, 151_000, (rows, seq), generator=g, dtype=torch.int64)
    left_pad = torch.randint(0, max(1, (seq - resp) // 2), (rows, 1), generator=g)
    attention_mask = (torch.arange(seq).unsqueeze(0) >= left_pad).to(torch.int64)
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp_(min=0)
    responses = input_ids[:, seq - resp :].clone()
    old_log_probs = -torch.rand((rows, resp), generator=g, dtype=torch.float32) * 5
    advantages = torch.randn((rows, resp), generator=g, dtype=torch.float32)

    # Distinct ~prompt_chars strings: different windows of one random text, each its own str object.
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz      ", dtype=np.uint8)
    text = letters[rng.integers(0, len(letters), size=rows * 64 + 2 * prompt_chars)].tobytes().decode("ascii")
    lengths = rng.integers(int(prompt_chars * 0.9), int(prompt_chars * 1.1) + 1, size=rows)
    prompts = [f"<|user|> #{i}: " + text[i * 64 : i * 64 + int(n)] for i, n in enumerate(lengths)]

    tools = ["search", "python", "calculator", "browser"]
    n_calls = rng.integers(0, 4, size=rows)
    tool_calls = [
        [
            {"name": tools[int(rng.integers(0, len(tools)))], "turn": t, "score": float(rng.random())}
            for t in range(int(k))
        ]
        for k in n_calls
    ]
    return {
        "tensors": {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "position_ids": position_ids,
            "responses": responses,
            "old_log_probs": old_log_probs,
            "advantages": advantages,
        },
        "prompt": prompts,
        "tool_calls": tool_calls,
        "meta_info": {"global_step": 1, "temperature": 1.0},
    }


def tensor_bytes(raw: dict[str, Any]) -> int:
    return sum(t.numel() * t.element_size() for t in raw["tensors"].values())


def string_bytes(strings: list[str]) -> int:
    return sum(len(s.encode()) for s in strings)


def object_array(values: list[Any]) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):  # element-wise: equal-length lists must stay lists
        out[i] = value
    return out


def slice_raw(raw: dict[str, Any], start: int, stop: int) -> dict[str, Any]:
    """Rows ``start:stop`` with their own storage (what 8 workers would each send back)."""
    return {
        "tensors": {k: v[start:stop].clone() for k, v in raw["tensors"].items()},
        "prompt": [str(s) for s in raw["prompt"][start:stop]],
        "tool_calls": copy.deepcopy(raw["tool_calls"][start:stop]),
        "meta_info": dict(raw["meta_info"]),
    }


# --- the two implementations behind one interface -----------------------------------------------------------
class RollImpl:
    name = "roll"

    def __init__(self) -> None:
        from roll.protocol import DataProto, has_tensor_extra

        self.DP = DataProto
        # roll.protocol imports its tensor section (tensordict) on first use. Import it now, before freeze_heap():
        # otherwise its objects stay in the collected generations and every gc.collect() between repetitions walks
        # them (~50 ms here), leaving the caches cold for the operation timed next.
        has_tensor_extra()

    def build(self, raw: dict[str, Any]):
        return self.DP.from_dict(
            tensors=dict(raw["tensors"]),
            non_tensors={"prompt": raw["prompt"], "tool_calls": raw["tool_calls"]},
            meta_info=dict(raw["meta_info"]),
        )

    def prompt_column(self, dp) -> Any:
        return dp.non_tensor_batch.column("prompt")


class VerlImpl:
    name = "verl"

    def __init__(self) -> None:
        from verl.protocol import DataProto

        self.DP = DataProto

    def build(self, raw: dict[str, Any]):
        return self.DP.from_dict(
            tensors=dict(raw["tensors"]),
            non_tensors={"prompt": object_array(raw["prompt"]), "tool_calls": object_array(raw["tool_calls"])},
            meta_info=dict(raw["meta_info"]),
        )


# --- operations ---------------------------------------------------------------------------------------------
def _reps(args: argparse.Namespace, floor: int, value: int | None = None) -> int:
    """Repetitions for a cheap measurement: at least ``floor`` for a stable median, except in --quick runs."""
    value = args.reps if value is None else value
    return value if getattr(args, "quick", False) else max(value, floor)


OPS = ("chunk", "concat", "select_idxs", "repeat", "pickle")


def run_ops(impl, raw: dict[str, Any], args: argparse.Namespace, log) -> dict[str, Any]:
    """Time chunk / concat / select_idxs / repeat / pickling on one implementation. Same code for roll and verl."""
    import torch

    DP = impl.DP
    rows = len(raw["prompt"])
    nbytes = tensor_bytes(raw)
    reps, warmup = args.reps, args.warmup
    fast_reps = _reps(args, 50)  # sub-millisecond operations: more reps for a stable median
    want = set(args.only or OPS)
    out: dict[str, Any] = {"bytes": {"tensors": nbytes, "repeat_output_tensors": nbytes * REPEAT}}

    t0 = time.perf_counter()
    dp = impl.build(raw)
    out["build_s"] = time.perf_counter() - t0
    assert len(dp) == rows

    if "chunk" in want:
        log(f"[{impl.name}] chunk({CHUNKS})")
        out["chunk"] = measure(lambda: dp.chunk(CHUNKS), reps=fast_reps, warmup=_reps(args, 3, warmup))
        parts = dp.chunk(CHUNKS)
        assert sum(len(p) for p in parts) == rows
        assert torch.equal(parts[-1].batch["responses"][-1], raw["tensors"]["responses"][-1])
        del parts

    if "concat" in want:
        log(f"[{impl.name}] concat of {CHUNKS} parts")
        bounds = np.linspace(0, rows, CHUNKS + 1).astype(int)
        parts = [impl.build(slice_raw(raw, int(a), int(b))) for a, b in itertools.pairwise(bounds)]
        out["concat"] = measure(lambda: DP.concat(parts), reps=reps, warmup=warmup)
        if impl.name == "roll":
            # The same with the buffer cache emptied before each call: every output lands on fresh pages.
            from roll.protocol._tensor_ops import buffer_cache

            out["concat_fresh"] = measure(
                lambda _: DP.concat(parts), setup=lambda: buffer_cache().clear(), reps=reps, warmup=warmup
            )
        joined = DP.concat(parts)
        assert len(joined) == rows and torch.equal(joined.batch["input_ids"], raw["tensors"]["input_ids"])
        assert list(joined.non_tensor_batch["prompt"][-2:]) == raw["prompt"][-2:]
        del joined, parts
        gc.collect()

    if "select_idxs" in want:
        log(f"[{impl.name}] select_idxs (random half)")
        idx = np.random.default_rng(1).permutation(rows)[: rows // 2].astype(np.int64)
        out["select_idxs"] = measure(lambda: dp.select_idxs(idx), reps=reps, warmup=warmup)
        picked = dp.select_idxs(idx)
        assert torch.equal(picked.batch["advantages"][3], raw["tensors"]["advantages"][int(idx[3])])
        assert picked.non_tensor_batch["prompt"][3] == raw["prompt"][int(idx[3])]
        del picked

    if "repeat" in want:
        log(f"[{impl.name}] repeat({REPEAT}, interleave=True)")
        out["repeat"] = measure(lambda: dp.repeat(REPEAT, interleave=True), reps=reps, warmup=warmup)
        gc.collect()

    if "pickle" in want:
        log(f"[{impl.name}] pickle in band (default protocol {pickle.DEFAULT_PROTOCOL})")
        out["pickle_inband"] = _time_pickle(dp, reps, warmup, mode="default")
        log(f"[{impl.name}] pickle in band (protocol 5, no buffer_callback)")
        out["pickle_inband_p5"] = _time_pickle(dp, reps, warmup, mode="p5")
        log(f"[{impl.name}] pickle out of band")
        out["pickle_oob"] = _time_pickle(dp, reps, warmup, mode="oob")
        back = pickle.loads(pickle.dumps(dp))
        assert torch.equal(back.batch["position_ids"], raw["tensors"]["position_ids"])
        assert list(back.non_tensor_batch["tool_calls"][:4]) == raw["tool_calls"][:4]
        del back

    out["dp"] = dp  # handed to the Ray part, removed before returning JSON
    return out


def _time_pickle(dp, reps: int, warmup: int, mode: str) -> dict[str, Any]:
    """``default``: pickle.dumps(dp) (in band, the default protocol); ``p5``: protocol 5 in band;
    ``oob``: protocol 5 with buffer_callback (loads reads the original buffers: nothing is copied)."""
    oob = mode == "oob"
    dumps_t, loads_t, total_t, sizes, faults = [], [], [], [], []
    for i in range(warmup + reps):
        gc.collect()
        bufs: list[pickle.PickleBuffer] = []
        with gc_disabled():
            f0 = minor_faults()
            t0 = time.perf_counter()
            if oob:
                payload = pickle.dumps(dp, protocol=5, buffer_callback=bufs.append)
            elif mode == "p5":
                payload = pickle.dumps(dp, protocol=5)
            else:
                payload = pickle.dumps(dp)
            t1 = time.perf_counter()
            back = pickle.loads(payload, buffers=bufs) if oob else pickle.loads(payload)
            t2 = time.perf_counter()
            f1 = minor_faults()
        assert len(back) == len(dp)
        sizes.append(len(payload) + sum(memoryview(b).nbytes for b in bufs))
        del back, payload, bufs
        if i >= warmup:
            faults.append(f1 - f0)
            dumps_t.append(t1 - t0)
            loads_t.append(t2 - t1)
            total_t.append(t2 - t0)
    res = summarize(total_t)
    res["dumps"] = summarize(dumps_t)
    res["loads"] = summarize(loads_t)
    res["serialized_bytes"] = sizes[-1]
    res["minor_faults"] = int(np.median(faults))
    return res


# --- Ray ------------------------------------------------------------------------------------------------------
def run_ray(dp, args: argparse.Namespace, log, label: str, extra_actor_env: dict[str, str] | None = None):
    """ray.put the batch, pass the ObjectRef to an actor method; time (a) a checksum back, (b) the batch back."""
    import ray

    @ray.remote(num_cpus=1)
    class Sink:
        def touch(self, batch) -> int:
            # Touch real data: one tensor's bytes and the length.
            return len(batch) + int(batch.batch["responses"][:, :8].sum())

        def echo(self, batch):
            return batch

        def ready(self) -> bool:
            return True

    opts = {"runtime_env": {"env_vars": extra_actor_env}} if extra_actor_env else {}
    actor = cast(Any, Sink).options(**opts).remote()  # a ray.remote class: options() is Ray's
    ray.get(actor.ready.remote())
    expect = len(dp) + int(dp.batch["responses"][:, :8].sum())
    res: dict[str, Any] = {}
    for kind in ("touch", "echo"):
        log(f"[{label}] ray round trip ({kind})")
        put_t, total_t = [], []
        for i in range(args.warmup + args.reps):
            gc.collect()
            with gc_disabled():
                t0 = time.perf_counter()
                ref = ray.put(dp)
                t1 = time.perf_counter()
                if kind == "touch":
                    got = ray.get(actor.touch.remote(ref))
                    ok = got == expect
                else:
                    got = ray.get(actor.echo.remote(ref))
                    ok = len(got) == len(dp)
                t2 = time.perf_counter()
            assert ok, f"ray {kind} returned a wrong result"
            del ref, got
            if i >= args.warmup:
                put_t.append(t1 - t0)
                total_t.append(t2 - t0)
        res[kind] = summarize(total_t)
        res[kind]["put"] = summarize(put_t)
    ray.kill(actor)
    return res


def ray_init() -> float:
    import ray

    t0 = time.perf_counter()
    # address="local": always a fresh cluster of our own, never one that another process left running.
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    return time.perf_counter() - t0


# --- baselines (roll side only) ---------------------------------------------------------------------------------
def run_copy_baselines(raw: dict[str, Any], args: argparse.Namespace, log) -> dict[str, Any]:
    """memcpy bandwidth (np.copyto into a pre-faulted buffer), np.concatenate of 8 parts, and torch.cat of the
    batch's own tensors in 8 parts (what DataProto.concat does underneath, without the DataProto)."""
    import torch

    nbytes = tensor_bytes(raw)
    log("[baseline] memcpy / np.concatenate / torch.cat")
    src = np.empty(nbytes, dtype=np.uint8)
    src[:] = 7
    dst = np.empty_like(src)
    dst[:] = 0  # fault the pages in: this is pure copy bandwidth
    res = {"copyto": measure(functools.partial(np.copyto, dst, src), reps=args.reps, warmup=args.warmup)}
    del dst
    parts = [p.copy() for p in np.array_split(src, CHUNKS)]
    del src
    gc.collect()
    res["concatenate"] = measure(functools.partial(np.concatenate, parts), reps=args.reps, warmup=args.warmup)
    del parts
    rows = next(iter(raw["tensors"].values())).shape[0]
    bounds = np.linspace(0, rows, CHUNKS + 1).astype(int)
    tparts = {k: [v[a:b].clone() for a, b in itertools.pairwise(bounds)] for k, v in raw["tensors"].items()}
    res["torch_cat"] = measure(functools.partial(_cat_each, torch.cat, tparts), reps=args.reps, warmup=args.warmup)
    del tparts
    gc.collect()
    return res


def _cat_each(
    cat: Callable[[list[torch.Tensor]], torch.Tensor], parts_by_key: dict[str, list[torch.Tensor]]
) -> list[torch.Tensor]:
    return [cat(ps) for ps in parts_by_key.values()]


def run_copying_chunk(dp, raw: dict[str, Any], args: argparse.Namespace, log) -> dict[str, Any]:
    log("[baseline] copying chunk")
    res = {
        # DataProto.chunk followed by a deep copy of each part (tensors and columns).
        "chunk_then_clone": measure(lambda: [p.clone() for p in dp.chunk(CHUNKS)], reps=args.reps, warmup=args.warmup),
        # Only the tensor bytes: torch.chunk + clone of every tensor (the cheapest copying chunk).
        "tensors_only": measure(
            lambda: [[c.clone() for c in t.chunk(CHUNKS)] for t in raw["tensors"].values()],
            reps=args.reps,
            warmup=args.warmup,
        ),
    }
    return res


def run_chunk_scaling(impl, raw: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """chunk() on a batch with 1/16 of the tensor bytes (same rows): O(1) in bytes means the same time."""
    small = dict(raw)
    small["tensors"] = {k: v[:, : max(1, v.shape[1] // 16)].contiguous() for k, v in raw["tensors"].items()}
    dp_small = impl.build(small)
    res = measure(lambda: dp_small.chunk(CHUNKS), reps=_reps(args, 50), warmup=_reps(args, 3, args.warmup))
    res["tensor_bytes"] = tensor_bytes(small)
    return res


def run_string_column(raw: dict[str, Any], args: argparse.Namespace, log, with_ray: bool) -> dict[str, Any]:
    """Pickle the prompt column (and the nested column) as roll stores it (Arrow) vs a numpy object array."""
    from roll.protocol import DataProto

    res: dict[str, Any] = {}
    for key in ("prompt", "tool_calls"):
        log(f"[strings] {key}: Arrow column vs numpy object array")
        roll_dp = DataProto.from_dict(non_tensors={key: raw[key]})
        forms = {
            "roll_dataproto": roll_dp,  # what travels: a DataProto holding only this column
            "arrow_column": roll_dp.non_tensor_batch.column(key),
            "numpy_object": object_array(raw[key]),  # what verl / ROLL store
        }
        col: dict[str, Any] = {}
        for name, obj in forms.items():
            col[name] = {
                "oob_transport": _time_column_pickle(obj, args, copy_buffers=True),
                "oob_no_copy": _time_column_pickle(obj, args, copy_buffers=False),
            }
            if with_ray:
                import ray

                def ray_roundtrip(obj=obj):
                    ref = ray.put(obj)
                    back = ray.get(ref)
                    del ref
                    return back

                col[name]["ray_put_get"] = measure(ray_roundtrip, reps=_reps(args, 10), warmup=args.warmup)
        res[key] = col
    res["prompt_bytes"] = string_bytes(raw["prompt"])
    return res


def _time_column_pickle(obj, args: argparse.Namespace, copy_buffers: bool) -> dict[str, Any]:
    """Out-of-band pickle round trip (protocol 5). With ``copy_buffers`` the stream and every buffer are copied
    once between dumps and loads, as a transport (Ray's object store) does; without, loads reads the originals."""

    def roundtrip():
        bufs: list[pickle.PickleBuffer] = []
        payload = pickle.dumps(obj, protocol=5, buffer_callback=bufs.append)
        if copy_buffers:
            payload = bytearray(payload)
            bufs = [bytearray(b.raw()) for b in bufs]
        return pickle.loads(payload, buffers=bufs)

    back = roundtrip()
    assert len(back) == len(obj)
    return measure(roundtrip, reps=_reps(args, 20), warmup=args.warmup)


# --- verl side (runs in the verl venv) ------------------------------------------------------------------------
def verl_side(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(args.threads)
    log = _logger(args)
    t0 = time.perf_counter()
    impl = VerlImpl()
    import_s = time.perf_counter() - t0
    if not args.no_ray:
        importlib.import_module("ray")  # imported before freeze_heap() so its objects are frozen too
    raw = make_raw_batch(args.rows, args.seq, args.resp, args.prompt_chars)
    freeze_heap()
    res = run_ops(impl, raw, args, log)
    res["import_s"] = import_s
    dp = res.pop("dp")
    res["chunk_small"] = run_chunk_scaling(impl, raw, args)
    if not args.no_ray:
        import ray

        res["ray_init_s"] = ray_init()
        try:
            res["ray"] = run_ray(dp, args, log, "verl")
            # verl's opt-in serialization (VERL_DATAPROTO_SERIALIZATION_METHOD=numpy), for context only.
            os.environ["VERL_DATAPROTO_SERIALIZATION_METHOD"] = "numpy"
            res["ray_numpy_method"] = run_ray(
                dp, args, log, "verl numpy", extra_actor_env={"VERL_DATAPROTO_SERIALIZATION_METHOD": "numpy"}
            )
            os.environ.pop("VERL_DATAPROTO_SERIALIZATION_METHOD")
        finally:
            ray.shutdown()
    res["peak_rss_mib"] = peak_rss_mib()
    import verl

    res["version"] = getattr(verl, "__version__", "?")
    emit_result(res)


def run_thp_probe(args: argparse.Namespace, log) -> dict[str, Any]:
    """The allocating operations again in a subprocess with THP_MEM_ALLOC_ENABLE=1, which makes torch's CPU
    allocator ask for transparent huge pages: shows how much of their time is page faults on 4 KiB pages."""
    log("[probe] concat / select_idxs / repeat with THP_MEM_ALLOC_ENABLE=1 (subprocess)")
    cmd = [
        *module_command(sys.executable, "protocol"),
        "--probe",
        *("--only", "concat", "select_idxs", "repeat"),
        *("--rows", str(args.rows), "--seq", str(args.seq), "--resp", str(args.resp)),
        *("--prompt-chars", str(args.prompt_chars), "--reps", str(args.reps), "--warmup", str(args.warmup)),
        *("--threads", str(args.threads)),
    ]
    try:
        return run_json_subprocess(cmd, timeout_s=600, env={"THP_MEM_ALLOC_ENABLE": "1"})
    except Exception as e:
        return {"error": f"probe failed: {e}"}


def probe_side(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(args.threads)
    impl = RollImpl()
    raw = make_raw_batch(args.rows, args.seq, args.resp, args.prompt_chars)
    freeze_heap()
    res = run_ops(impl, raw, args, _logger(args))
    res.pop("dp")
    res["env"] = {"THP_MEM_ALLOC_ENABLE": os.environ.get("THP_MEM_ALLOC_ENABLE")}
    emit_result(res)


def run_verl(args: argparse.Namespace, log) -> dict[str, Any]:
    side_args = [
        "--verl-side",
        *("--rows", str(args.rows), "--seq", str(args.seq), "--resp", str(args.resp)),
        *("--prompt-chars", str(args.prompt_chars), "--reps", str(args.reps), "--warmup", str(args.warmup)),
        *("--threads", str(args.threads)),
        *(["--no-ray"] if args.no_ray else []),
        *(["--verbose"] if args.verbose else []),
    ]
    return run_verl_side("protocol", side_args, timeout_s=args.verl_timeout, log=log)


# --- report ---------------------------------------------------------------------------------------------------
def _med(d: dict[str, Any] | None, *path: str) -> float | None:
    for p in path:
        if not isinstance(d, dict) or p not in d:
            return None
        d = d[p]
    return d.get("median_s") if isinstance(d, dict) else None


def _p90(d: dict[str, Any] | None, *path: str) -> float | None:
    for p in path:
        if not isinstance(d, dict) or p not in d:
            return None
        d = d[p]
    return d.get("p90_s") if isinstance(d, dict) else None


def _faults(d: dict[str, Any] | None, *path: str) -> str:
    for p in path:
        if not isinstance(d, dict) or p not in d:
            return "-"
        d = d[p]
    n = d.get("minor_faults") if isinstance(d, dict) else None
    return "-" if n is None else f"{n:,}"


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


def _fx(x: float | None, digits: int = 2) -> str:
    if x is None:
        return "-"
    return f"{x:,.0f}x" if x >= 100 else f"{x:.{digits}f}x"


def build_report(
    roll: dict[str, Any], base: dict[str, Any], verl: dict[str, Any], strings: dict[str, Any], probe: dict[str, Any]
):
    nbytes = roll["bytes"]["tensors"]
    v = verl if "error" not in verl else {}
    ops = [
        ("chunk(8)", ("chunk",), None),
        ("concat 8 parts", ("concat",), nbytes),
        ("select_idxs half", ("select_idxs",), nbytes // 2),
        ("repeat(8)", ("repeat",), nbytes * REPEAT),
        (f"pickle in-band (protocol {pickle.DEFAULT_PROTOCOL})", ("pickle_inband",), nbytes),
        ("  dumps", ("pickle_inband", "dumps"), nbytes),
        ("  loads", ("pickle_inband", "loads"), nbytes),
        ("pickle in-band (protocol 5)", ("pickle_inband_p5",), nbytes),
        ("pickle out-of-band (p5 + buffers)", ("pickle_oob",), nbytes),
        ("ray put -> actor(ref) -> checksum", ("ray", "touch"), nbytes),
        ("  of which ray.put", ("ray", "touch", "put"), nbytes),
        ("ray put -> actor(ref) -> DataProto", ("ray", "echo"), nbytes),
    ]
    rows = []
    ratios: dict[str, float | None] = {}
    for label, path, moved in ops:
        r_med, r_p90, v_med = _med(roll, *path), _p90(roll, *path), _med(v, *path)
        if r_med is None:
            continue
        speedup = _ratio(v_med, r_med)
        ratios["verl_over_roll." + ".".join(path)] = speedup
        rows.append(
            [
                label,
                fmt_seconds(r_med),
                fmt_seconds(r_p90),
                fmt_rate(moved / r_med) if moved and r_med else "-",
                _faults(roll, *path),
                fmt_seconds(v_med),
                fmt_seconds(_p90(v, *path)),
                _fx(speedup),
            ]
        )
    for kind, label in (("touch", "checksum"), ("echo", "DataProto")):
        v_med = _med(v, "ray_numpy_method", kind)
        if v_med is None:
            continue
        key = f"verl_over_roll.ray_numpy_method.{kind}"
        ratios[key] = _ratio(v_med, _med(roll, "ray", kind))
        rows.append(
            [
                f"  same, verl numpy serialization ({label})",
                "",
                "",
                "",
                "",
                fmt_seconds(v_med),
                fmt_seconds(_p90(v, "ray_numpy_method", kind)),
                _fx(ratios[key]),
            ]
        )
    main_table = table(
        rows, ["operation", "roll med", "roll p90", "roll GB/s", "page faults", "verl med", "verl p90", "verl/roll"]
    )

    copyto, npcat = _med(base, "memcpy", "copyto"), _med(base, "memcpy", "concatenate")
    tcat = _med(base, "memcpy", "torch_cat")
    concat, chunk = _med(roll, "concat"), _med(roll, "chunk")
    cc_clone, cc_tensors = _med(base, "copying_chunk", "chunk_then_clone"), _med(base, "copying_chunk", "tensors_only")

    def brow(label: str, src: dict[str, Any], path: tuple[str, ...], moved: int | None, vs_copyto: bool) -> list[str]:
        t = _med(src, *path)
        return [
            label,
            fmt_seconds(t),
            fmt_rate(moved / t) if moved and t else "-",
            f"{copyto / t:.0%}" if vs_copyto and t and copyto else "-",
            _faults(src, *path),
        ]

    base_rows = [
        brow("np.copyto into a pre-faulted buffer (memcpy)", base, ("memcpy", "copyto"), nbytes, True),
        brow(f"np.concatenate of {CHUNKS} parts", base, ("memcpy", "concatenate"), nbytes, True),
        brow(f"torch.cat of the {CHUNKS} parts' tensors (no DataProto)", base, ("memcpy", "torch_cat"), nbytes, True),
        brow("roll DataProto.concat (freed outputs' memory reused)", roll, ("concat",), nbytes, True),
        brow("roll DataProto.concat, fresh buffers (cache emptied)", roll, ("concat_fresh",), nbytes, True),
    ]
    for op, moved in (("concat", nbytes), ("select_idxs", nbytes // 2), ("repeat", nbytes * REPEAT)):
        if _med(probe, op) is not None:
            label = f"roll {op}, THP_MEM_ALLOC_ENABLE=1 (subprocess)"
            base_rows.append(brow(label, probe, (op,), moved, op == "concat"))
    base_rows += [
        brow(
            "copying chunk: DataProto.chunk + clone() of each part",
            base,
            ("copying_chunk", "chunk_then_clone"),
            nbytes,
            False,
        ),
        brow(
            "copying chunk: torch chunk + clone of the tensors only",
            base,
            ("copying_chunk", "tensors_only"),
            nbytes,
            False,
        ),
        brow("roll chunk (views)", roll, ("chunk",), None, False),
        brow(
            f"roll chunk, 1/16 of the bytes ({fmt_bytes(roll['chunk_small']['tensor_bytes'])})",
            roll,
            ("chunk_small",),
            None,
            False,
        ),
    ]
    base_table = table(base_rows, ["baseline (same bytes)", "median", "bandwidth", "of memcpy", "page faults"])

    str_rows = []
    for key in ("prompt", "tool_calls"):
        col = strings[key]
        for mode in ("oob_transport", "oob_no_copy", "ray_put_get"):
            obj_t = _med(col, "numpy_object", mode)
            if obj_t is None:
                continue
            dp_t, arrow_t = _med(col, "roll_dataproto", mode), _med(col, "arrow_column", mode)
            ratios[f"object_over_roll.{key}.{mode}.dataproto"] = _ratio(obj_t, dp_t)
            ratios[f"object_over_roll.{key}.{mode}.arrow"] = _ratio(obj_t, arrow_t)
            str_rows.append(
                [
                    f"{key}: {mode}",
                    fmt_seconds(dp_t),
                    fmt_seconds(arrow_t),
                    fmt_seconds(obj_t),
                    _fx(_ratio(obj_t, dp_t)),
                    _fx(_ratio(obj_t, arrow_t)),
                ]
            )
    str_table = table(str_rows, ["column round trip", "roll DP", "Arrow col", "np object", "obj/DP", "obj/Arrow"])

    # Targets.
    chunk_x, chunk_strict = _ratio(cc_clone, chunk), _ratio(cc_tensors, chunk)
    concat_frac = _ratio(copyto, concat)
    touch_x, echo_x = ratios.get("verl_over_roll.ray.touch"), ratios.get("verl_over_roll.ray.echo")
    ray_x = min(touch_x, echo_x) if touch_x is not None and echo_x is not None else None
    # Serialization is dumps + loads with the buffers out of band. A transport then copies the bytes once more, the
    # same bytes for both forms; that memcpy floor is reported beside the target (and in the table above).
    str_x = ratios.get("object_over_roll.prompt.oob_no_copy.dataproto")

    def met(x: float | None, want: float) -> bool | None:
        return None if x is None else x >= want

    targets: dict[str, dict[str, Any]] = {
        "chunk_o1": {
            "ratio": chunk_x,
            "target": TARGETS["chunk_vs_copying_chunk"],
            "met": met(chunk_x, TARGETS["chunk_vs_copying_chunk"]),
            "what": "(DataProto.chunk + clone() of each part) / roll chunk",
            "bytes_scaling": _ratio(chunk, _med(roll, "chunk_small")),
        },
        "chunk_o1_strict": {
            "ratio": chunk_strict,
            "target": TARGETS["chunk_vs_copying_chunk"],
            "met": met(chunk_strict, TARGETS["chunk_vs_copying_chunk"]),
            "what": "(torch chunk + clone of the tensors only, the cheapest copying chunk) / roll chunk",
        },
        "concat_bandwidth": {
            "ratio": concat_frac,
            "target": TARGETS["concat_vs_memcpy"],
            "met": met(concat_frac, TARGETS["concat_vs_memcpy"]),
            "what": "roll concat bandwidth / np.copyto bandwidth (same bytes)",
            "vs_np_concatenate": _ratio(npcat, concat),
            "vs_torch_cat": _ratio(tcat, concat),
            "with_thp_alloc": _ratio(copyto, _med(probe, "concat")),
            "fresh_buffers": _ratio(copyto, _med(roll, "concat_fresh")),
        },
        "ray_vs_verl": {
            "ratio": ray_x,
            "target": TARGETS["ray_vs_verl"],
            "met": met(ray_x, TARGETS["ray_vs_verl"]),
            "what": "verl / roll Ray round-trip median, the lower of the checksum and the DataProto-back trips",
            "touch": touch_x,
            "echo": echo_x,
        },
        "strings_vs_object_array": {
            "ratio": str_x,
            "target": TARGETS["strings_vs_object_array"],
            "met": met(str_x, TARGETS["strings_vs_object_array"]),
            "what": "numpy object array / roll DataProto, prompt column, pickle protocol 5 round trip "
            "(buffers out of band); plus one transport copy of the bytes: see with_transport_copy",
            "with_transport_copy": ratios.get("object_over_roll.prompt.oob_transport.dataproto"),
            "through_ray": ratios.get("object_over_roll.prompt.ray_put_get.dataproto"),
        },
    }
    target_rows = []
    for name, t in targets.items():
        wanted = f">= {t['target']:.0%}" if t["target"] < 1 else f">= {t['target']:.0f}x"
        measured = f"{t['ratio']:.0%}" if t["ratio"] is not None and t["target"] < 1 else _fx(t["ratio"])
        status = {True: "MET", False: "MISSED", None: "n/a"}[t["met"]]
        target_rows.append([name, measured, wanted, status, t["what"]])
    target_table = table(target_rows, ["target", "measured", "wanted", "status", "definition"], left=(0, 4))
    return main_table, base_table, str_table, target_table, targets, ratios


# --- main -----------------------------------------------------------------------------------------------------
def _logger(args: argparse.Namespace):
    start = time.perf_counter()

    def log(msg: str) -> None:
        if args.verbose or not args.quiet_progress:
            print(f"  {time.perf_counter() - start:7.1f}s {msg}", file=sys.stderr, flush=True)

    return log


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    add_report_arguments(p)
    p.add_argument("--rows", type=int, default=4096)
    p.add_argument("--seq", type=int, default=2048, help="tokens per row (input_ids, attention_mask, position_ids)")
    p.add_argument("--resp", type=int, default=None, help="response tokens per row (default seq/2)")
    p.add_argument("--prompt-chars", type=int, default=2048, help="approximate length of each prompt string")
    p.add_argument("--reps", type=int, default=5, help="timed repetitions (after warm-up)")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    p.add_argument("--quick", action="store_true", help="smoke run: 64 rows x 128 tokens, 2 reps, no verl")
    p.add_argument("--no-verl", action="store_true", help="skip the verl baseline")
    p.add_argument("--no-ray", action="store_true", help="skip the Ray round trips")
    p.add_argument("--verl-timeout", type=float, default=900.0)
    p.add_argument("--raw-times", action="store_true", help="keep every repetition's time in the RESULT json")
    p.add_argument("--verbose", action="store_true")
    p.add_argument("--quiet-progress", action="store_true", help="no progress lines on stderr")
    p.add_argument("--no-thp-probe", action="store_true", help="skip the THP_MEM_ALLOC_ENABLE=1 subprocess probe")
    p.add_argument("--only", nargs="+", choices=OPS, help=argparse.SUPPRESS)
    p.add_argument("--verl-side", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.rows, args.seq, args.prompt_chars, args.reps, args.warmup = 64, 128, 256, 2, 1
        args.no_verl = args.no_thp_probe = True
    if args.resp is None:
        args.resp = max(1, args.seq // 2)
    if args.rows < CHUNKS or args.rows % CHUNKS:
        p.error(f"--rows must be a positive multiple of {CHUNKS} (verl's chunk needs equal parts)")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.verl_side:
        verl_side(args)
        return
    if args.probe:
        probe_side(args)
        return
    import torch

    torch.set_num_threads(args.threads)
    log = _logger(args)
    wall0 = time.perf_counter()

    impl = RollImpl()
    if not args.no_ray:
        importlib.import_module("ray")  # imported before freeze_heap() so its objects are frozen too
    raw = make_raw_batch(args.rows, args.seq, args.resp, args.prompt_chars)
    nbytes = tensor_bytes(raw)
    freeze_heap()
    log(f"batch: {args.rows} rows, tensors {fmt_bytes(nbytes)}, prompts {fmt_bytes(string_bytes(raw['prompt']))}")
    roll = run_ops(impl, raw, args, log)
    dp = roll.pop("dp")
    roll["chunk_small"] = run_chunk_scaling(impl, raw, args)
    base = {"memcpy": run_copy_baselines(raw, args, log), "copying_chunk": run_copying_chunk(dp, raw, args, log)}

    with_ray = not args.no_ray
    if with_ray:
        import ray

        roll["ray_init_s"] = ray_init()
        try:
            roll["ray"] = run_ray(dp, args, log, "roll")
            strings = run_string_column(raw, args, log, with_ray=True)
        finally:
            ray.shutdown()
    else:
        strings = run_string_column(raw, args, log, with_ray=False)
    roll["peak_rss_mib"] = peak_rss_mib()
    del dp
    gc.collect()

    probe = {"skipped": True} if args.no_thp_probe else run_thp_probe(args, log)

    if args.no_verl:
        verl: dict[str, Any] = {"skipped": True, "error": "skipped (--no-verl / --quick)"}
    else:
        log("[verl] side benchmark in its own venv")
        verl = run_verl(args, log)

    main_table, base_table, str_table, target_table, targets, ratios = build_report(roll, base, verl, strings, probe)
    shape = (
        f"{args.rows} rows: input_ids/attention_mask/position_ids int64 [{args.seq}], responses int64 [{args.resp}], "
        f"old_log_probs/advantages float32 [{args.resp}], prompt str ~{args.prompt_chars} B, tool_calls list[dict]"
    )
    print(f"roll.protocol benchmark  ({shape})")
    print(
        f"tensor bytes {fmt_bytes(nbytes)}, prompt bytes {fmt_bytes(strings['prompt_bytes'])}; "
        f"median of {args.reps} reps after {args.warmup} warm-up; torch threads {args.threads}; "
        f"load avg {environment()['loadavg']}"
    )
    print()
    print(main_table)
    if "error" in verl:
        print(f"(verl: {verl['error']})")
    print()
    print(base_table)
    print()
    print(str_table)
    print()
    print(target_table)
    if args.quick:
        print(
            "(--quick: tiny sizes, so the targets above are not meaningful; this run only checks that the bench works)"
        )
    print()
    print(
        f"peak RSS: main {roll['peak_rss_mib']:.0f} MiB"
        + (f", verl side {verl['peak_rss_mib']:.0f} MiB" if "peak_rss_mib" in verl else "")
    )

    result = {
        "config": {
            "rows": args.rows,
            "seq": args.seq,
            "resp": args.resp,
            "prompt_chars": args.prompt_chars,
            "reps": args.reps,
            "warmup": args.warmup,
            "threads": args.threads,
            "quick": args.quick,
            "tensor_bytes": nbytes,
            "prompt_bytes": strings["prompt_bytes"],
        },
        "env": environment(),
        "roll": roll,
        "baselines": base,
        "strings": strings,
        "verl": verl,
        "thp_probe": probe,
        "ratios": ratios,
        "targets": targets,
        "wall_s": time.perf_counter() - wall0,
    }
    emit_result(result if args.raw_times else _drop_raw_times(result), args.result_file)


def _drop_raw_times(value: Any) -> Any:
    """The RESULT without the per-repetition ``times_s`` lists (median/p90/min/max/mean stay)."""
    if isinstance(value, dict):
        return {k: _drop_raw_times(v) for k, v in value.items() if k != "times_s"}
    if isinstance(value, list):
        return [_drop_raw_times(v) for v in value]
    return value


if __name__ == "__main__":
    main()
