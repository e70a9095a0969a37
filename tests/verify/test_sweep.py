"""precision_lab.verify.sweep: exhaustive sweeps on Dask. The same records from a real LocalCluster
(two worker processes), the threaded scheduler and a plain loop; a worker killed mid-sweep;
resumption from checkpoints without recomputation; mismatches found and reported; the CLI."""

from __future__ import annotations

import importlib
import json
import os
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

pytest.importorskip("dask", reason='needs the [dask] extra: pip install "precision_lab[dask]"')

import dask

import precision_lab as pl
from precision_lab.cli import main
from precision_lab.core import pool as _parallel
from precision_lab.verify.oracles import ml_dtypes_oracle, referee
from precision_lab.verify.sweep import (
    SweepSpec,
    _ranges,
    _run_chunk,
    check_chunk,
    verify_exhaustive,
)

pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered in cast")

MODES = ("nearest_even", "nearest_away", "toward_zero", "up", "down", "odd")
BOTH = ("ieee", "saturate")


def plain_loop(fmt, *, input, against, modes, overflow, chunk, start=0, stop=None):
    """The sweep without Dask: check_chunk over the chunks, one after the other."""
    stop = (1 << (32 if input == "float32" else 16)) if stop is None else stop
    spec = SweepSpec(
        pl.get_format(fmt),
        input,
        against,
        tuple((m, o) for m in modes for o in overflow),
        "keep",
        8,
    )
    return [check_chunk(spec, lo, hi) for lo, hi in _ranges(start, stop, chunk)]


def records(res):
    return [{k: v for k, v in c.items() if k != "reused"} for c in res.chunks]


@pytest.mark.parametrize("source", ["float16", "bfloat16"])
def test_every_16_bit_input_same_on_cluster_threads_and_loop(dask_cluster, source):
    _, client = dask_cluster
    kw = {"input": source, "against": "referee", "modes": MODES, "overflow": BOTH, "chunk": 2**13}
    on_cluster = verify_exhaustive("e4m3", client=client, quiet=True, **kw)
    threads = verify_exhaustive("e4m3", quiet=True, **kw)
    loop = plain_loop("e4m3", **kw)
    assert on_cluster.ok and threads.ok
    assert on_cluster.checked == threads.checked == 1 << 16
    assert len(on_cluster.counts) == 12
    assert records(on_cluster) == records(threads) == loop


def test_float32_slice_same_on_cluster_threads_and_loop(dask_cluster):
    _, client = dask_cluster
    # 2**24 patterns ending 2**20 into the NaNs: bf16's largest binades, its overflow, +inf
    kw = {"input": "float32", "against": "ml_dtypes", "modes": ("nearest_even",)}
    kw |= {"overflow": BOTH, "chunk": 2**22, "start": 0x7E900000, "stop": 0x7F900000}
    on_cluster = verify_exhaustive("bf16", client=client, quiet=True, **kw)
    threads = verify_exhaustive("bf16", quiet=True, **kw)
    assert on_cluster.ok, on_cluster.summary()
    assert on_cluster.checked == 2**24 and on_cluster.computed == 5
    assert records(on_cluster) == records(threads) == plain_loop("bf16", **kw)


def test_scheduler_address_and_progress_bars(dask_cluster, capsys):
    cluster, _ = dask_cluster
    kw = {"input": "float16", "against": "ml_dtypes", "chunk": 2**14}
    by_address = verify_exhaustive("e5m2", client=cluster.scheduler_address, **kw)
    local = verify_exhaustive("e5m2", **kw)  # dask.diagnostics.ProgressBar
    assert by_address.ok and records(by_address) == records(local)
    assert "100% Completed" in capsys.readouterr().out


def slow_ml_dtypes(x, fmt, **kw):
    """ml_dtypes, slowly: keeps a sweep running long enough to kill a worker in the middle."""
    time.sleep(0.3)
    return ml_dtypes_oracle(x, fmt, **kw)


def test_killed_worker_still_gives_the_complete_result(dask_cluster, tmp_path):
    import cloudpickle

    cluster, client = dask_cluster
    client.wait_for_workers(2)
    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import tests/
    kw = {"input": "float16", "modes": ("nearest_even",), "overflow": BOTH, "chunk": 2**12}
    out = {}

    def run():
        out["res"] = verify_exhaustive(
            "e5m2", against=slow_ml_dtypes, client=client, out=tmp_path, quiet=True, **kw
        )

    sweep = threading.Thread(target=run)
    sweep.start()
    deadline = time.monotonic() + 60
    while not list(tmp_path.glob("*/*.json")) and time.monotonic() < deadline:
        time.sleep(0.05)
    done_at_kill = len(list(tmp_path.glob("*/*.json")))
    victim = next(iter(cluster.workers.values()))
    os.kill(victim.process.pid, signal.SIGKILL)
    sweep.join(120)
    cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    assert 1 <= done_at_kill < 16  # the kill fell in the middle of the sweep
    res = out["res"]
    assert res.ok and res.checked == 1 << 16 and len(res.chunks) == 16
    assert [c["lo"] for c in res.chunks] == list(range(0, 1 << 16, 2**12))
    want = plain_loop("e5m2", against="ml_dtypes", **kw)
    assert [c["mismatches"] for c in res.chunks] == [c["mismatches"] for c in want]
    assert len(list(tmp_path.glob("*/*.json"))) == 16
    client.wait_for_workers(2, timeout=60)  # the nanny restarts the worker


def single_threaded_referee(x, fmt, **kw):
    """The referee, failing unless the task runs precision_lab single-threaded."""
    if _parallel._OVERRIDE.get() != 1:
        raise AssertionError(f"task threads: {_parallel._OVERRIDE.get()!r}, expected 1")
    return referee(x, fmt, **kw)


def test_tasks_run_single_threaded_with_identical_records(dask_cluster, monkeypatch):
    """Each task runs its chunks inline (Dask is the parallelism): no pool, the same records."""
    import cloudpickle

    from precision_lab.verify import sweep

    monkeypatch.setattr(_parallel, "WORKERS", 2)  # a real pool even on a one-core machine
    monkeypatch.setattr(sweep, "_BLOCK", 2**20)  # blocks large enough for the pool
    pools = []
    real_pool = _parallel._pool
    monkeypatch.setattr(_parallel, "_pool", lambda n: pools.append(n) or real_pool(n))
    spec = SweepSpec(
        pl.get_format("e4m3"), "float32", "ml_dtypes", (("nearest_even", "ieee"),), "keep", 8
    )
    lo, hi = 0x43E00000, 0x43E00000 + 2**20  # 448.0 (e4m3 max) to 512: ties and overflow
    pooled = check_chunk(spec, lo, hi)
    assert pools  # outside a task, the calls used the pool
    pools.clear()
    assert _run_chunk(spec, lo, hi, None) == pooled and not pools
    kw = {"input": "float16", "against": single_threaded_referee, "chunk": 2**14, "quiet": True}
    threads = verify_exhaustive("e4m3", client="threads", **kw)
    assert threads.ok and not pools
    _, client = dask_cluster
    client.wait_for_workers(2, timeout=60)
    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import tests/
    try:
        on_cluster = verify_exhaustive("e4m3", client=client, **kw)
    finally:
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    assert records(on_cluster) == records(threads)


CALLS = {"n": 0, "fail_from": None}
_LOCK = threading.Lock()


def counting_referee(x, fmt, **kw):
    """The referee, counting its calls (one per chunk and key); fails on request."""
    with _LOCK:
        CALLS["n"] += 1
    if CALLS["fail_from"] is not None and x.size and np.nanmax(np.abs(x)) >= CALLS["fail_from"]:
        raise RuntimeError("interrupted")
    return referee(x, fmt, **kw)


def test_resumed_sweep_recomputes_nothing_already_checkpointed(tmp_path):
    kw = {"input": "float16", "against": counting_referee, "chunk": 2**12, "out": tmp_path}
    kw |= {"overflow": BOTH, "quiet": True, "client": "threads"}
    CALLS.update(n=0, fail_from=None)
    half = verify_exhaustive("e4m3", stop=2**15, **kw)  # the positive half only
    assert (half.computed, half.reused, CALLS["n"]) == (8, 0, 16)
    CALLS["n"] = 0
    full = verify_exhaustive("e4m3", **kw)
    assert (full.computed, full.reused, CALLS["n"]) == (8, 8, 16)
    assert records(full) == records(verify_exhaustive("e4m3", **{**kw, "out": None}))
    # an interrupted run (a task raises) keeps its finished chunks; the rerun does the rest
    folder = tmp_path / os.path.basename(full.path)
    for p in sorted(folder.glob("*.json"))[8:]:
        p.unlink()  # the negative half is missing again
    CALLS.update(n=0, fail_from=1000.0)
    pool = ThreadPoolExecutor(2)
    with pytest.raises(RuntimeError, match="interrupted"), dask.config.set(pool=pool):
        verify_exhaustive("e4m3", **kw)
    pool.shutdown(wait=True)  # the tasks still running when the error came up finish here
    finished = len(list(folder.glob("*.json")))
    CALLS.update(n=0, fail_from=None)
    again = verify_exhaustive("e4m3", **kw)
    assert again.computed == 16 - finished and CALLS["n"] == 2 * again.computed
    assert records(again) == records(full)
    assert not list(folder.glob(".tmp-*"))  # atomic writes leave no temporary files
    assert all(json.loads(p.read_text())["checked"] == 2**12 for p in folder.glob("*.json"))


def one_wrong(x, fmt, *, mode, overflow, subnormals):
    """The referee with two planted errors: 1.0 rounds to 2.0, and NaN codes lose their sign."""
    values, codes = referee(x, fmt, mode=mode, overflow=overflow, subnormals=subnormals)
    values, codes = values.copy(), codes.copy()
    one = x == 1.0
    values[one], codes[one] = 2.0, 0x40
    codes[np.isnan(x)] &= 0x7F
    return values, codes


def test_mismatches_are_counted_and_shown():
    res = verify_exhaustive("e4m3", input="bfloat16", against=one_wrong, chunk=2**14, quiet=True)
    assert not res.ok
    n_neg_nan = int(np.isnan(np.arange(1 << 15, 1 << 16, dtype=np.uint16).view("bfloat16")).sum())
    # 1.0: value and code; negative NaNs: code only (NaN values match any NaN)
    assert res.counts["nearest_even", "ieee"] == {"values": 1, "codes": 1 + n_neg_nan}
    first = res.mismatches[0]
    assert first["bits"] == "0x3f80" and first["got"] == "1.0" and first["want"] == "2.0"
    assert first["got_code"] == "0x38" and first["want_code"] == "0x40"
    assert sum(len(c["examples"]) for c in res.chunks) == len(res.mismatches) <= 4 * 8
    text = res.summary()
    assert text.startswith("e4m3 from all 65536 bfloat16 patterns against test_sweep.one_wrong: ")
    assert f"MISMATCHES ({2 + n_neg_nan} in all)" in text and "e.g. {'bits': '0x3f80'" in text


def test_blocks_inside_a_chunk_give_the_same_record(monkeypatch):
    """check_chunk works in blocks: the record (counts, first examples of each key, in order)
    does not depend on the block size."""
    from precision_lab.verify import sweep

    keys = tuple(("nearest_even", o) for o in BOTH)
    for fmt, against in (("e4m3", one_wrong), ("e2m1", "referee")):  # e2m1: NaNs skipped
        spec = SweepSpec(pl.get_format(fmt), "bfloat16", against, keys, "keep", 8)
        monkeypatch.setattr(sweep, "_BLOCK", 1 << 16)
        whole = check_chunk(spec, 0x3000, 1 << 16)
        monkeypatch.setattr(sweep, "_BLOCK", 1000)
        assert check_chunk(spec, 0x3000, 1 << 16) == whole
    assert whole["skipped"] > 0
    spec = SweepSpec(pl.get_format("e4m3"), "bfloat16", one_wrong, keys, "keep", 8)
    record = check_chunk(spec, 0x3000, 1 << 16)
    assert [e["overflow"] for e in record["examples"]] == ["ieee"] * 8  # the first key's first
    assert (
        record["examples"][0]["bits"] == "0x3f80"
        and record["mismatches"]["nearest_even/saturate"][1] > 8
    )


def test_options_are_checked():
    with pytest.raises(ValueError, match="input"):
        verify_exhaustive("e4m3", input="float64")
    with pytest.raises(ValueError, match="deterministic"):
        verify_exhaustive("e4m3", modes="stochastic")
    with pytest.raises(ValueError, match="against"):
        verify_exhaustive("e4m3", against="gfloat")
    with pytest.raises(ValueError, match="start and stop"):
        verify_exhaustive("e4m3", input="float16", stop=2**17)
    with pytest.raises(ValueError, match="floating-point"):
        verify_exhaustive("int8")
    with pytest.raises(ValueError, match="nearest even only"):
        verify_exhaustive("e4m3", input="float16", against="ml_dtypes", modes="up", quiet=True)


def test_cli_verify(capsys, tmp_path):
    argv = ["verify", "e4m3", "--input", "float16", "--against", "ml_dtypes", "--quiet"]
    argv += ["--overflow", "ieee", "--overflow", "saturate", "--scheduler", "sync"]
    assert main([*argv, "--out", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "OK" in text and "nearest_even  saturate" in text
    assert main([*argv, "--out", str(tmp_path), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["ok"] and info["checked"] == 65536 and info["reused_chunks"] == 1


def test_without_dask_import_and_cli_say_how_to_install(monkeypatch, capsys):
    for name in ("precision_lab.verify.sweep", "precision_lab.verify.grid"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.setitem(sys.modules, "dask", None)  # as if Dask were not installed
    with pytest.raises(ImportError, match=r'pip install "precision_lab\[dask\]"'):
        importlib.import_module("precision_lab.verify.sweep")
    with pytest.raises(ImportError, match=r'pip install "precision_lab\[dask\]"'):
        importlib.import_module("precision_lab.verify.grid")
    assert main(["verify", "e4m3"]) == 1
    assert main(["grid", "spec.json"]) == 1
    err = capsys.readouterr().err
    assert err.count('pip install "precision_lab[dask]"') == 2
    assert float(pl.round_to(1.0, "e4m3")) == 1.0  # the rest works


class _FakeTensor:
    """Just enough of torch.Tensor for the torch oracle: ``to``, ``view``, ``numpy``."""

    def __init__(self, a):
        self._a = a

    def to(self, dtype):
        with np.errstate(over="ignore"):  # (torch does not warn on overflow either)
            return _FakeTensor(self._a.astype(dtype))

    def view(self, dtype):
        return _FakeTensor(self._a.view(dtype))

    def numpy(self):
        return self._a


def test_torch_oracle_path_with_a_fake_torch(monkeypatch):
    """The sweep's torch path (dtype names, clamping, code views) with a torch-like module whose
    casts are ml_dtypes' (it checks the plumbing, not torch's casts): the records of the
    ml_dtypes oracle. With real torch installed, tests/verify/test_oracles.py checks torch
    itself."""
    import types

    import ml_dtypes

    from precision_lab.verify.oracles import TORCH_DTYPES

    calls = []
    fake = types.ModuleType("torch")
    fake.from_numpy = lambda a: calls.append(a.size) or _FakeTensor(a)
    fake.float32, fake.uint8, fake.int16 = np.float32, np.uint8, np.int16
    for name in TORCH_DTYPES.values():
        setattr(fake, name, getattr(ml_dtypes, name, None) or np.dtype(name))
    monkeypatch.setitem(sys.modules, "torch", fake)
    kw = {"input": "bfloat16", "overflow": BOTH, "chunk": 2**14, "quiet": True}
    for fmt in ("e4m3", "bf16", "fp16"):
        calls.clear()
        by_torch = verify_exhaustive(fmt, against="torch", **kw)
        assert by_torch.ok and by_torch.against == "torch", by_torch.summary()
        assert sum(calls) == by_torch.checked * 2  # every input, under both overflow switches
        assert records(by_torch) == records(verify_exhaustive(fmt, against="ml_dtypes", **kw))
