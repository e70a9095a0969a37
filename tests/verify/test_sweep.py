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
    local = verify_exhaustive("e5m2", **kw)  # progress: captured stdout is no terminal
    assert by_address.ok and records(by_address) == records(local)
    out = capsys.readouterr().out
    assert "done 4 of 4 tasks" in out and "\r" not in out  # plain lines, no bar updates


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
    # it reads a lock and a counter, which no fingerprint can key: the test names its behaviour
    with pytest.raises(ValueError, match="cannot be keyed for checkpoints"):
        verify_exhaustive("e4m3", **kw)
    kw["oracle_key"] = "the referee, counting"
    CALLS.update(n=0, fail_from=None)
    half = verify_exhaustive("e4m3", stop=2**15, **kw)  # the positive half only
    assert (half.computed, half.reused, CALLS["n"]) == (8, 0, 16)
    CALLS["n"] = 0
    full = verify_exhaustive("e4m3", **kw)
    assert (full.computed, full.reused, CALLS["n"]) == (8, 8, 16)
    assert records(full) == records(
        verify_exhaustive("e4m3", **{**kw, "out": None, "oracle_key": None})
    )
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


# ----- issue 19: checkpoints keyed by the oracle's behaviour, damaged files, arguments -----------
def planted(x, fmt, **kw):
    """The referee with a bug: every input 1.0 rounds to 2.0."""
    values, codes = referee(x, fmt, **kw)
    values = np.where(x == 1.0, 2.0, values)
    return values, codes


def test_planted_bug_in_a_lambda_is_found_with_a_checkpoint_folder(tmp_path):
    """Issue 19 item 2: a good lambda, then a bad one, with the same out=: the bad one used to
    reuse the good one's checkpoints (same name "<lambda>") and report OK."""
    good = lambda x, fmt, **kw: referee(x, fmt, **kw)  # noqa: E731
    bad = lambda x, fmt, **kw: planted(x, fmt, **kw)  # noqa: E731
    kw = {"input": "float16", "chunk": 2**14, "out": tmp_path, "quiet": True}
    first = verify_exhaustive("e4m3", against=good, **kw)
    assert first.ok and (first.computed, first.reused) == (4, 0)
    again = verify_exhaustive("e4m3", against=good, **kw)  # the same oracle resumes
    assert again.ok and (again.computed, again.reused) == (0, 4)
    res = verify_exhaustive("e4m3", against=bad, **kw)
    assert not res.ok and res.computed == 4 and res.reused == 0
    assert res.counts["nearest_even", "ieee"]["values"] == 1
    assert res.mismatches[0]["x"] == "1.0"


def make_oracle(shift):
    def oracle(x, fmt, **kw):  # the same code; the closure decides
        values, codes = referee(x, fmt, **kw)
        return np.where(x == 1.0, values * shift, values), codes

    return oracle


def test_closures_and_called_functions_change_the_key(tmp_path, monkeypatch):
    kw = {"input": "float16", "chunk": 2**15, "out": tmp_path, "quiet": True}
    assert verify_exhaustive("e5m2", against=make_oracle(1.0), **kw).ok
    res = verify_exhaustive("e5m2", against=make_oracle(2.0), **kw)
    assert not res.ok and res.reused == 0
    # a function the oracle calls changes: so does the key
    from precision_lab.verify import sweep

    via = lambda x, fmt, **kw: planted(x, fmt, **kw)  # noqa: E731
    before = sweep.oracle_fingerprint(via)
    monkeypatch.setitem(globals(), "planted", lambda x, fmt, **kw: referee(x, fmt, **kw))
    assert sweep.oracle_fingerprint(via) != before
    assert sweep.oracle_fingerprint("referee") == sweep.oracle_fingerprint("referee")


class CallableOracle:
    def __call__(self, x, fmt, **kw):
        return referee(x, fmt, **kw)


def test_an_oracle_that_cannot_be_keyed_is_refused_with_out(tmp_path):
    kw = {"input": "float16", "chunk": 2**15, "quiet": True}
    assert verify_exhaustive("e5m2", against=CallableOracle(), **kw).ok  # no out: fine
    with pytest.raises(ValueError, match="cannot be keyed for checkpoints"):
        verify_exhaustive("e5m2", against=CallableOracle(), out=tmp_path, **kw)
    res = verify_exhaustive("e5m2", against=CallableOracle(), out=tmp_path, oracle_key="mine", **kw)
    assert res.ok and res.computed == 2


@pytest.mark.parametrize(
    "content",
    [b"", b'{"lo": 0, "hi": 16384, "chec', b"not json", b"[1, 2]", b'{"lo": 0}', b"\xff\xfe"],
)
def test_damaged_checkpoint_is_named_and_recomputed(tmp_path, content):
    """Issue 19 item 3: an empty or truncated chunk file gave a bare JSONDecodeError, a missing
    key KeyError: 'nearest_even/ieee'."""
    kw = {"input": "float16", "chunk": 2**14, "out": tmp_path, "quiet": True}
    kw |= {"against": "referee", "overflow": BOTH}
    fresh = verify_exhaustive("e4m3", **kw)
    folder = tmp_path / os.path.basename(fresh.path)
    victim = sorted(folder.glob("*.json"))[1]
    victim.write_bytes(content)
    with pytest.warns(RuntimeWarning, match=f"checkpoint {victim} is damaged"):
        res = verify_exhaustive("e4m3", **kw)
    assert res.damaged == [str(victim)] and (res.computed, res.reused) == (1, 3)
    assert records(res) == records(fresh)
    assert f"damaged checkpoint recomputed: {victim}" in res.summary()
    assert json.loads(victim.read_text())["checked"] == 2**14  # rewritten


def test_checkpoint_of_another_key_or_chunk_is_damaged(tmp_path):
    kw = {"input": "float16", "chunk": 2**14, "out": tmp_path, "quiet": True}
    fresh = verify_exhaustive("e4m3", **kw)
    folder = tmp_path / os.path.basename(fresh.path)
    a, b = sorted(folder.glob("*.json"))[:2]
    record = json.loads(a.read_text())
    del record["mismatches"]["nearest_even/ieee"]
    a.write_text(json.dumps(record))
    b.write_text(json.dumps({**record, "lo": 0}))
    with pytest.warns(RuntimeWarning, match="damaged") as caught:
        res = verify_exhaustive("e4m3", **kw)
    text = " ".join(str(w.message) for w in caught)
    assert "no mismatch counts for nearest_even/ieee" in text and "it holds chunk" in text
    assert res.damaged == [str(a), str(b)] and records(res) == records(fresh)


def test_start_chunk_and_out_arguments(tmp_path, capsys):
    """Issue 19 item 3: start=0.5 gave "Unknown format code 'x'", chunk=np.int64(16384) was
    refused, --out naming a file gave a traceback."""
    with pytest.raises(ValueError, match=r"start must be an integer, got 0.5"):
        verify_exhaustive("e4m3", input="float16", start=0.5, quiet=True)
    with pytest.raises(ValueError, match=r"stop must be an integer"):
        verify_exhaustive("e4m3", input="float16", stop="10", quiet=True)
    with pytest.raises(ValueError, match=r"chunk must be an integer"):
        verify_exhaustive("e4m3", input="float16", chunk=True, quiet=True)
    res = verify_exhaustive(
        "e4m3", input="float16", chunk=np.int64(16384), start=np.uint16(0), quiet=True
    )
    assert res.ok and res.chunk == 16384 and type(res.chunk) is int and len(res.chunks) == 4
    assert "[0x0" not in res.summary()  # the full range
    afile = tmp_path / "a-file"
    afile.write_text("x")
    with pytest.raises(ValueError, match="out must be a folder"):
        verify_exhaustive("e4m3", input="float16", out=afile, quiet=True)
    with pytest.raises(ValueError, match="cannot create the checkpoint folder"):
        verify_exhaustive("e4m3", input="float16", out=afile / "sub", quiet=True)
    assert main(["verify", "e4m3", "--input", "float16", "--quiet", "--out", str(afile)]) == 1
    err = capsys.readouterr().err
    assert "precision-lab verify: error: out must be a folder" in err and "Traceback" not in err


def test_cli_verify_p3109_exits_0_on_the_correct_core(capsys):
    """Issue 19 item 1: the referee's wrong inf code gave 768 false mismatches and exit 1."""
    assert main(["verify", "p3109_k8p3se", "--input", "float16", "--quiet"]) == 0
    assert "OK (no mismatch)" in capsys.readouterr().out


P3109_SWEPT = ["p3109_k8p3se", "p3109_k8p4se", "p3109_k6p3se", "p3109_k8p8se", "p3109_k8p1se"]
P3109_SWEPT += ["p3109_k8p3ue", "p3109_k8p1sf", "p3109_k4p2ue", "p3109_k3p3se"]


@pytest.mark.parametrize("name", P3109_SWEPT)
def test_p3109_sweep_against_the_core_every_mode_but_odd_overflow(name):
    """The referee and the core agree on every float16 pattern in every mode and both overflow
    switches, except round to odd without saturation (next test)."""
    kw = {"input": "float16", "chunk": 2**16, "quiet": True, "client": "sync"}
    modes = ("nearest_even", "nearest_away", "nearest_zero", "toward_zero", "up", "down")
    res = verify_exhaustive(name, modes=modes, overflow=BOTH, **kw)
    assert res.ok, res.summary()
    res = verify_exhaustive(name, modes="odd", overflow="saturate", **kw)
    assert res.ok, res.summary()


@pytest.mark.parametrize("name", ["p3109_k8p3se", "p3109_k8p4se", "p3109_k4p2ue", "e4m3fnuz"])
def test_p3109_round_to_odd_overflow_against_the_core(name):
    res = verify_exhaustive(name, input="float16", modes="odd", overflow="ieee", quiet=True)
    assert res.ok, res.summary()


def test_elements_per_second_is_the_speed_and_rate_its_deprecated_name():
    """Issue 32 item 10: ``r.rate`` next to Melem/s figures read like a mismatch rate. The speed
    is ``elements_per_second`` (swept inputs over wall time); ``rate`` warns and agrees."""
    r = verify_exhaustive(
        "e5m2", input="float16", against="ml_dtypes", stop=2**12, chunk=2**11, quiet=True
    )
    assert r.ok and r.seconds > 0
    assert r.elements_per_second == pytest.approx(2**12 / r.seconds)
    with pytest.warns(DeprecationWarning, match="use elements_per_second"):
        assert r.rate == r.elements_per_second
