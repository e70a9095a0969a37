"""precision_lab.verify.grid: experiment grids on Dask. The same table from a real LocalCluster,
the local schedulers and a plain loop; failures reported with their configuration, finished runs
kept; reruns served from the cache; SPEC files; the CLI."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

pytest.importorskip("dask", reason='needs the [dask] extra: pip install "precision_lab[dask]"')

from precision_lab.cli import main
from precision_lab.core import pool as _parallel
from precision_lab.verify import grid
from precision_lab.verify.grid import config_hash, expand_spec, load_spec, run_config, run_grid

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

SPEC = {
    "kind": "gemm",
    "base": {"m": 4, "k": 256, "n": 4, "distribution": "uniform"},
    "product": {"input_format": ["bf16", "e4m3"], "accumulator": ["fp32", "bf16"], "seed": [0, 1]},
    "runs": [
        {"accumulator": {"format": "fp16", "order": "pairwise"}},
        {"accumulator": "fp32", "distribution": "cauchy"},  # fails: unknown distribution
    ],
}
TRAIN = {"kind": "train", "run": "bf16", "epochs": 1, "hidden": [8], "batch_size": 256}


def configs():
    return [*expand_spec(SPEC), TRAIN]


def same_rows(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.keys() == y.keys()
        for k in x:
            both_nan = isinstance(x[k], float) and math.isnan(x[k]) and math.isnan(y[k])
            assert both_nan or x[k] == y[k], (k, x, y)


def test_grid_same_on_cluster_local_schedulers_and_loop(dask_cluster):
    _, client = dask_cluster
    client.wait_for_workers(2, timeout=60)
    cfgs = configs()
    on_cluster = run_grid(cfgs, client=client, quiet=True)
    threads = run_grid(cfgs, client="threads", quiet=True)
    loop = []
    for c in cfgs:
        try:
            loop.append({**grid._with_defaults(c), **run_config(c)})
        except ValueError:
            pass
    same_rows(on_cluster.rows, loop)
    same_rows(threads.rows, loop)
    assert len(on_cluster.rows) == 10 and on_cluster.computed == 11
    (failed,) = on_cluster.failures
    assert failed["distribution"] == "cauchy" and "distribution must be" in failed["error"]
    assert failed == threads.failures[0]
    train_row = on_cluster.rows[-1]
    assert train_row["run"] == "bf16" and train_row["steps"] == 5
    assert 0.0 <= train_row["final_test_acc"] <= 1.0


def test_grid_metrics_measure_the_accumulator():
    rows = run_grid(expand_spec(SPEC), client="sync", quiet=True).rows
    err = {(r["input_format"], json.dumps(r["accumulator"]), r.get("seed")): r for r in rows}
    for fmt in ("bf16", "e4m3"):
        for seed in (0, 1):
            wide, narrow = err[fmt, '"fp32"', seed], err[fmt, '"bf16"', seed]
            # k = 256 positive terms: a bf16 running sum loses bits at every step, an fp32 one
            # (products of at most 16 significant bits) only a few ulps of fp32
            assert wide["max_rel"] < 2**-21 and wide["snr_db"] > 130
            assert narrow["max_rel"] > 2**-6 and narrow["snr_db"] < 40


def test_cache_reuses_finished_runs_and_keeps_failures_out(tmp_path, monkeypatch):
    cfgs = expand_spec(SPEC)
    first = run_grid(cfgs, client="sync", out=tmp_path, quiet=True)
    assert (first.computed, first.reused, len(first.failures)) == (10, 0, 1)
    calls = []
    real = grid.run_config
    monkeypatch.setattr(grid, "run_config", lambda c: calls.append(c) or real(c))
    again = run_grid(cfgs, client="sync", out=tmp_path, quiet=True)
    assert (again.computed, again.reused) == (1, 9)  # only the failure runs again
    assert calls == [cfgs[-1]]
    same_rows(again.rows, first.rows)
    # a new package version invalidates the cache
    monkeypatch.setattr(grid, "__version__", "0.0.0-other")
    assert run_grid(cfgs[:2], client="sync", out=tmp_path, quiet=True).computed == 2
    assert len(list((tmp_path / "cache").glob("*.json"))) == 11
    assert config_hash(cfgs[0]) != config_hash(cfgs[1])


def test_table_files(tmp_path):
    res = run_grid(expand_spec(SPEC), client="sync", out=tmp_path, quiet=True)
    with (tmp_path / "results.csv").open() as fh:
        table = list(csv.DictReader(fh))
    assert len(table) == 9
    assert list(table[0])[:4] == ["kind", "m", "k", "n"]
    assert {"input_format", "accumulator", "seed", "max_rel", "snr_db"} <= set(table[0])
    assert float(table[0]["max_rel"]) == res.rows[0]["max_rel"]
    assert json.loads(table[-1]["accumulator"]) == {"format": "fp16", "order": "pairwise"}
    failures = json.loads((tmp_path / "failures.json").read_text())
    assert [f["distribution"] for f in failures] == ["cauchy"]
    assert isinstance(res.table(), list) or res.table().shape[0] == 9  # pandas when installed


def test_specs():
    assert len(load_spec(EXAMPLES / "grid_gemm.json")) == 3 * 3 * 3 + 2
    assert len(load_spec(EXAMPLES / "grid_training.json")) == 5 * 3
    assert expand_spec({"kind": "gemm"}) == [{"kind": "gemm"}]
    with pytest.raises(ValueError, match="unknown keys"):
        expand_spec({"kind": "gemm", "grid": {}})
    with pytest.raises(ValueError, match="non-empty lists"):
        expand_spec({"kind": "gemm", "product": {"seed": 3}})
    with pytest.raises(ValueError, match="kind must be one of"):
        expand_spec({"kind": "bench"})
    with pytest.raises(ValueError, match="unknown field"):
        run_config({"kind": "gemm", "size": 3})


def test_cli_grid(tmp_path, capsys):
    spec = tmp_path / "tiny.json"
    spec.write_text(
        json.dumps(
            {"kind": "gemm", "base": {"m": 2, "k": 32, "n": 2}, "product": {"seed": [0, 1, 2]}}
        )
    )
    out = tmp_path / "res"
    argv = ["grid", str(spec), "--out", str(out), "--scheduler", "sync", "--quiet"]
    assert main(argv) == 0
    assert "3 runs finished (3 computed, 0 from the cache), 0 failed" in capsys.readouterr().out
    assert main(argv) == 0
    assert "(0 computed, 3 from the cache)" in capsys.readouterr().out
    assert (out / "results.csv").read_text().count("\n") == 4
    spec.write_text(json.dumps({"kind": "gemm", "runs": [{"input_format": "nope"}]}))
    assert main(argv) == 1
    assert "nope" in capsys.readouterr().err


def test_grid_task_runs_single_threaded(monkeypatch):
    """A grid task's chunked calls run inline (the runs are the parallel work); same metrics."""
    import threading

    monkeypatch.setattr(_parallel, "WORKERS", 2)  # a real pool even on a one-core machine
    big = {"kind": "gemm", "m": 64, "k": 4096, "n": 2}  # round_to of a: 2**18 elements, pooled
    assert grid._task(big) == {"ok": True, "metrics": run_config(big)}

    def threads_of_a_chunked_call(config):
        seen = set()
        _parallel.for_chunks(1 << 20, lambda lo, hi: seen.add(threading.get_ident()), chunk=1024)
        return {"threads": len(seen), "caller": int(threading.get_ident() in seen)}

    assert threads_of_a_chunked_call({})["caller"] == 0  # outside a task: the pool's threads
    monkeypatch.setattr(grid, "run_config", threads_of_a_chunked_call)
    assert grid._task(big) == {"ok": True, "metrics": {"threads": 1, "caller": 1}}


@pytest.mark.parametrize("content", [b"", b'{"config": {"kind": "ge', b"[]", b'{"config": 1}'])
def test_damaged_cache_file_is_named_and_recomputed(tmp_path, content):
    """As the sweep's checkpoints (issue 19 item 3): a damaged cache file gave a bare
    JSONDecodeError or KeyError; it is named in a warning and its run computed again."""
    cfgs = expand_spec(SPEC)[:3]
    first = run_grid(cfgs, client="sync", out=tmp_path, quiet=True)
    victim = tmp_path / "cache" / f"{config_hash(cfgs[1])}.json"
    victim.write_bytes(content)
    with pytest.warns(RuntimeWarning, match=f"cached run {victim} is damaged"):
        again = run_grid(cfgs, client="sync", out=tmp_path, quiet=True)
    assert (again.computed, again.reused) == (1, 2)
    same_rows(again.rows, first.rows)
    assert json.loads(victim.read_text())["metrics"]  # rewritten


def test_out_naming_a_file_is_a_clear_error(tmp_path, capsys):
    afile = tmp_path / "f"
    afile.write_text("x")
    with pytest.raises(ValueError, match="out must be a folder"):
        run_grid(expand_spec(SPEC)[:1], client="sync", out=afile, quiet=True)


def test_results_csv_columns_do_not_depend_on_the_cache(tmp_path):
    """Issue 22 item 14: a fresh table listed max_rel, mean_rel, max_ulp ... and a cached one
    max_rel, max_ulp, mean_rel ...: the metric columns now have one order."""
    cfgs = expand_spec(SPEC)
    fresh = run_grid(cfgs, client="sync", out=tmp_path, quiet=True)
    head_fresh = (tmp_path / "results.csv").read_text().splitlines()[0]
    cached = run_grid(cfgs, client="sync", out=tmp_path, quiet=True)
    assert cached.reused == fresh.computed - 1  # the failing run runs again
    assert (tmp_path / "results.csv").read_text().splitlines()[0] == head_fresh
    assert fresh.columns == cached.columns
    metrics = [c for c in fresh.columns if c in grid.METRICS["gemm"]]
    assert metrics == list(grid.METRICS["gemm"])


@pytest.mark.parametrize(
    ("spec", "want"),
    [
        ({"kind": "gemm", "product": {"input_formats": ["bf16"]}}, "did you mean 'input_format'"),
        ({"kind": "train", "base": {"epoch": 2}}, "did you mean 'epochs'"),
        ({"kind": "gemm", "runs": [{"zzz": 1}]}, "unknown field 'zzz' (known: "),
    ],
)
def test_misspelled_fields_are_refused_up_front(spec, want):
    """A misspelled field used to run and fail in every task; now the SPEC is refused before
    anything runs, with the nearest known names."""
    with pytest.raises(ValueError, match=want.replace("(", r"\(")):
        expand_spec(spec)
    with pytest.raises(ValueError, match="unknown field"):
        run_config({"kind": "gemm", "input_formats": "bf16"})


def test_progress_in_a_log_is_plain_lines(tmp_path, capsys):
    """Issue 22 item 15: where stdout is not a terminal (captured here), progress is a few plain
    lines, never carriage-return updates."""
    run_grid(expand_spec(SPEC)[:4], client="threads", quiet=False)
    out = capsys.readouterr().out
    assert "\r" not in out
    assert "done 4 of 4 tasks" in out


def test_example_training_grid_trains_long_enough():
    """examples/grid_training.json trained 10 steps, too few to compare formats (fp16 without
    loss scaling beat fp32 on a seed): it now runs the report's training setting, 80 optimizer
    steps, where FP16 without scaling and FP8 with delayed scaling measurably lose."""
    from precision_lab.training import RUNS

    for c in load_spec(EXAMPLES / "grid_training.json"):
        cfg = RUNS[c["run"]].replace(**{k: v for k, v in c.items() if k not in ("kind", "run")})
        steps = (1347 // cfg.batch_size) * cfg.epochs  # 1347 training images in the split
        assert steps >= 80, c
