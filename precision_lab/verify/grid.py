"""Experiment grids on Dask: many seeded training-emulation or GEMM-error runs, one tidy table.

A *configuration* is a flat JSON-able dict with a ``"kind"``:

``"train"``
    A run of :func:`precision_lab.training.train`: every other key is a field of
    :class:`~precision_lab.training.TrainConfig` (``hidden`` as a list, ``scaler_options`` as a
    dict, ``accumulator`` as a format name or a dict of :class:`~precision_lab.Accumulator`
    fields), and ``"run"`` may name one of :data:`~precision_lab.training.RUNS` as the starting
    point. Metrics: ``final_test_acc``, ``final_train_acc``, ``final_loss``, ``steps``,
    ``skipped_steps``, ``final_scale``.
``"gemm"``
    The error of one emulated GEMM: ``a`` (m x k) and ``b`` (k x n) drawn from ``distribution``
    (``"normal"``, ``"uniform"`` on [0, 1) or ``"lognormal"``) with ``seed``, rounded to
    ``input_format``, multiplied by :func:`precision_lab.gemm` with ``accumulator`` (a format
    name or a dict of Accumulator fields) into ``out_format``, against the float64 product of the
    same rounded inputs. Defaults: ``m=32, k=256, n=32, distribution="normal", seed=0,
    input_format="bf16", accumulator="fp32", out_format="fp32"``. Metrics: those of
    :func:`~precision_lab.error_stats` (``max_rel``, ``mean_rel``, ``normwise``, ``max_ulp``,
    ``mean_ulp``, ``snr_db``; ULPs of ``out_format``).

Every run is seeded and pure (the result depends on the configuration only), so it can run
anywhere, be retried after a lost worker, and be cached: with ``out=DIR`` each finished run is
stored in ``DIR/cache/<hash>.json``, the hash covering the configuration and the package version,
and a rerun only computes what is missing (failures are not cached: they run again; a damaged
cache file is named in a RuntimeWarning and its run computed again).

A SPEC file (``precision-lab grid SPEC.json``) is a JSON object::

    {
      "kind": "gemm",                                    # default kind of every configuration
      "base": {"m": 16, "k": 512, "n": 16},              # fields shared by every configuration
      "product": {"input_format": ["bf16", "e4m3"],      # the Cartesian product of these lists
                  "accumulator": ["fp32", "bf16"],
                  "seed": [0, 1]},
      "runs": [{"input_format": "fp16", "accumulator": "fp16"}]   # and these, one each
    }

``product`` and ``runs`` are both optional (neither: the one ``base`` configuration); each
configuration is ``base`` updated by one product combination or one run. examples/grid_gemm.json
is a complete example.

Where it runs: ``client=None`` uses Dask's local ``"processes"`` scheduler: nothing to start, and
the runs, which are mostly small numpy calls driven by Python, do not contend for one GIL as they
would in threads. Each run calls precision_lab single-threaded
(:func:`~precision_lab.core.pool.use_workers`): the runs themselves are the parallel work.
``client`` may also be ``"threads"`` or ``"sync"`` (Dask's other local schedulers), a scheduler
address or a ``dask.distributed.Client``. A run that raises is reported in
:attr:`GridResult.failures` with its configuration and the error; the others are kept. Needs the
``[dask]`` extra: ``pip install "precision_lab[dask]"``.

>>> spec = {"kind": "gemm", "base": {"m": 4, "k": 64, "n": 4},
...         "product": {"accumulator": ["fp32", "bf16"]}}
>>> res = run_grid(expand_spec(spec), client="sync", quiet=True)
>>> [(r["accumulator"], r["max_rel"] < 0.05) for r in res.rows]
[('fp32', True), ('bf16', True)]
>>> res.failures
[]
"""

from __future__ import annotations

import csv
import dataclasses
import difflib
import hashlib
import itertools
import json
import os
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..analysis import error_stats
from ..core.pool import use_workers
from ..core.rounding import round_to
from ..core.version import __version__
from ..gemm import Accumulator, gemm
from ..training import RUNS, TrainConfig, train
from . import progress as _progress
from .progress import is_terminal, local_progress

INSTALL = 'pip install "precision_lab[dask]"'
try:
    import dask
except ImportError as err:  # pragma: no cover - depends on the environment
    raise ImportError(f"precision_lab.verify.grid needs Dask: {INSTALL}") from err

__all__ = [
    "KINDS",
    "GridResult",
    "config_hash",
    "expand_spec",
    "load_spec",
    "run_config",
    "run_grid",
]

KINDS = ("train", "gemm")
_LOCAL = ("processes", "threads", "sync")
_GEMM_DEFAULTS: dict[str, Any] = {
    "m": 32,
    "k": 256,
    "n": 32,
    "distribution": "normal",
    "seed": 0,
    "input_format": "bf16",
    "accumulator": "fp32",
    "out_format": "fp32",
}


# ----- specs -------------------------------------------------------------------------------------
def expand_spec(spec: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The configurations of a SPEC object (see the module docstring), in order.

    >>> expand_spec({"kind": "gemm", "product": {"seed": [0, 1]}, "runs": [{"k": 8}]})
    [{'kind': 'gemm', 'seed': 0}, {'kind': 'gemm', 'seed': 1}, {'kind': 'gemm', 'k': 8}]
    """
    if not isinstance(spec, Mapping):
        raise ValueError(f"spec must be a JSON object, got {type(spec).__name__}")
    unknown = sorted(set(spec) - {"kind", "base", "product", "runs"})
    if unknown:
        raise ValueError(f"spec: unknown keys {unknown}; expected kind, base, product, runs")
    base = {"kind": spec.get("kind", "train"), **spec.get("base", {})}
    product = spec.get("product", {})
    runs = spec.get("runs", [])
    if not isinstance(product, Mapping) or not all(
        isinstance(v, list) and v for v in product.values()
    ):
        raise ValueError(
            f"spec['product'] must map field names to non-empty lists, got {product!r}"
        )
    if not isinstance(runs, list) or not all(isinstance(r, Mapping) for r in runs):
        raise ValueError(f"spec['runs'] must be a list of objects, got {runs!r}")
    configs = []
    if product:
        names = list(product)
        for combo in itertools.product(*(product[n] for n in names)):
            configs.append({**base, **dict(zip(names, combo, strict=True))})
    configs.extend({**base, **r} for r in runs)
    if not configs:
        configs.append(base)
    for c in configs:
        _check_fields(c)
    return configs


def _known_fields(kind: str) -> set[str]:
    if kind == "train":
        return {f.name for f in dataclasses.fields(TrainConfig)} | {"kind", "run"}
    return set(_GEMM_DEFAULTS) | {"kind"}


def _check_fields(config: Mapping[str, Any]) -> None:
    """Refuse a configuration whose kind or field names are unknown, before anything runs (a
    misspelled field would otherwise fail in every task), with the nearest known names."""
    kind = _check_kind(config)
    known = _known_fields(kind)
    for name in config:
        if name not in known:
            near = difflib.get_close_matches(str(name), sorted(known), n=2)
            hint = f"; did you mean {' or '.join(map(repr, near))}?" if near else ""
            raise ValueError(
                f"{kind} config: unknown field {name!r}{hint} (known: {', '.join(sorted(known))})"
            )


def load_spec(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The configurations of a SPEC JSON file."""
    try:
        spec = json.loads(Path(path).read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"SPEC {path}: not valid JSON ({err})") from None
    return expand_spec(spec)


def _check_kind(config: Mapping[str, Any]) -> str:
    kind = config.get("kind")
    if kind not in KINDS:
        raise ValueError(f"config kind must be one of {KINDS}, got {kind!r} in {dict(config)}")
    return str(kind)


def config_hash(config: Mapping[str, Any]) -> str:
    """Cache key of a configuration: a hash of its canonical JSON and the package version.

    >>> config_hash({"kind": "gemm", "seed": 1}) == config_hash({"seed": 1, "kind": "gemm"})
    True
    """
    text = json.dumps({"config": config, "version": __version__}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


# ----- one run -----------------------------------------------------------------------------------
def _accumulator(value: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, str):
        return Accumulator(value)
    if isinstance(value, Mapping):
        return Accumulator(**value)
    raise ValueError(f"accumulator must be a format name or an object of fields, got {value!r}")


def _train(config: Mapping[str, Any]) -> dict[str, Any]:
    fields = {k: v for k, v in config.items() if k not in ("kind", "run")}
    run = config.get("run")
    if run is not None and run not in RUNS:
        raise ValueError(f"run must be one of {sorted(RUNS)}, got {run!r}")
    if "hidden" in fields:
        fields["hidden"] = tuple(fields["hidden"])
    if "scaler_options" in fields:
        fields["scaler_options"] = tuple(sorted(dict(fields["scaler_options"]).items()))
    if "accumulator" in fields:
        fields["accumulator"] = _accumulator(fields["accumulator"])
    cfg = RUNS[run].replace(**fields) if run is not None else TrainConfig(**fields)
    r = train(cfg)
    return {
        "final_test_acc": float(r.final_test_acc),
        "final_train_acc": float(r.final_train_acc),
        "final_loss": float(r.final_loss),
        "steps": int(r.steps),
        "skipped_steps": int(r.n_skipped),
        "final_scale": float(r.scale[-1]) if r.scale else 1.0,
    }


def _gemm(config: Mapping[str, Any]) -> dict[str, Any]:
    c = {**_GEMM_DEFAULTS, **config}
    _check_fields(config)
    rng = np.random.default_rng(c["seed"])
    shapes = ((c["m"], c["k"]), (c["k"], c["n"]))
    dist = c["distribution"]
    if dist == "normal":
        a, b = (rng.standard_normal(s) for s in shapes)
    elif dist == "uniform":
        a, b = (rng.random(s) for s in shapes)
    elif dist == "lognormal":
        a, b = (rng.lognormal(size=s) for s in shapes)
    else:
        raise ValueError(f"distribution must be 'normal', 'uniform' or 'lognormal', got {dist!r}")
    fmt = c["input_format"]
    a, b = round_to(a, fmt), round_to(b, fmt)  # float64 on fmt's grid
    got = gemm(
        a,
        b,
        input_format=fmt,
        accumulator=_accumulator(c["accumulator"]),
        out_format=c["out_format"],
        backend="numpy",
    )
    stats = error_stats(got, a @ b, fmt=c["out_format"])
    keep = ("max_rel", "mean_rel", "normwise", "max_ulp", "mean_ulp", "snr_db")
    return {k: float(v) for k, v in asdict(stats).items() if k in keep}


def run_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The metrics of one configuration (a dict of numbers); raises on a bad configuration.

    >>> m = run_config({"kind": "gemm", "m": 2, "k": 16, "n": 2, "accumulator": "fp32"})
    >>> sorted(m)
    ['max_rel', 'max_ulp', 'mean_rel', 'mean_ulp', 'normwise', 'snr_db']
    """
    _check_fields(config)
    return _train(config) if config["kind"] == "train" else _gemm(config)


def _task(config: dict[str, Any]) -> dict[str, Any]:
    """The Dask task: a run's metrics, or its error (so one failure loses no other result).

    Single-threaded in precision_lab's pool: Dask runs the tasks in parallel.
    """
    try:
        with use_workers(1):
            return {"ok": True, "metrics": run_config(config)}
    except Exception as err:
        return {"ok": False, "error": f"{type(err).__name__}: {err}"}


# ----- the grid ----------------------------------------------------------------------------------
@dataclass
class GridResult:
    """Outcome of :func:`run_grid`.

    ``rows`` has one dict per finished run (configuration columns, with the defaults of gemm
    runs filled in, then metric columns), in the order of the configurations; ``failures``
    one dict per failed run (its configuration and ``"error"``). ``computed`` runs ran in this
    call, ``reused`` came from the cache.
    """

    rows: list[dict[str, Any]]
    failures: list[dict[str, Any]]
    computed: int
    reused: int
    path: str | None = None
    columns: list[str] = field(default_factory=list)

    def table(self) -> Any:
        """A pandas DataFrame of ``rows`` when pandas is installed, else the list of dicts."""
        try:
            import pandas as pd
        except ImportError:
            return self.rows
        return pd.DataFrame(self.rows, columns=self.columns)

    def to_csv(self, path: str | os.PathLike[str]) -> Path:
        """Write ``rows`` as CSV (nested values as JSON text); returns the path."""
        p = Path(path)
        with p.open("w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=self.columns)
            w.writeheader()
            for r in self.rows:
                w.writerow({k: _cell(r.get(k)) for k in self.columns})
        return p

    def to_parquet(self, path: str | os.PathLike[str]) -> Path:
        """Write ``rows`` as Parquet (needs pyarrow); returns the path."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        cols = {k: [_cell(r.get(k)) for r in self.rows] for k in self.columns}
        pq.write_table(pa.table(cols), str(path))
        return Path(path)


def _cell(v: Any) -> Any:
    if isinstance(v, list | dict):
        return json.dumps(v, sort_keys=True)
    return v


def _with_defaults(config: dict[str, Any]) -> dict[str, Any]:
    """A table row's configuration columns: gemm runs show their defaults too."""
    if config.get("kind") == "gemm":
        return {"kind": "gemm", **_GEMM_DEFAULTS, **config}
    return config


#: the metric columns of each kind, in table order (whatever order a cache file stored them in)
METRICS = {
    "train": (
        "final_test_acc",
        "final_train_acc",
        "final_loss",
        "steps",
        "skipped_steps",
        "final_scale",
    ),
    "gemm": ("max_rel", "mean_rel", "normwise", "max_ulp", "mean_ulp", "snr_db"),
}


def _columns(rows: Iterable[Mapping[str, Any]], metrics: Iterable[Mapping[str, Any]]) -> list[str]:
    """Configuration columns in order of first appearance, then the metric columns in the
    canonical order of :data:`METRICS` (fresh and cached runs give the same table)."""
    cols: dict[str, None] = {"kind": None}
    for r in rows:
        cols.update(dict.fromkeys(r))
    seen: set[str] = set()
    for m in metrics:
        seen.update(m)
    order = [k for kind in METRICS.values() for k in kind]
    return list(cols) + [k for k in order if k in seen] + sorted(seen - set(order) - set(cols))


def run_grid(
    configs: Iterable[Mapping[str, Any]],
    *,
    client: Any = None,
    out: str | os.PathLike[str] | None = None,
    quiet: bool = False,
) -> GridResult:
    """Run every configuration as a Dask task; gather the metrics into one table.

    Parameters
    ----------
    configs:
        Configurations (see the module docstring; :func:`expand_spec` makes them from a SPEC).
    client:
        ``None`` or ``"processes"`` (Dask's local process pool), ``"threads"``, ``"sync"``, a
        scheduler address, or a ``dask.distributed.Client``.
    out:
        Folder for the cache (``out/cache``) and the table (``out/results.csv``, and
        ``out/results.parquet`` when pyarrow is installed; ``out/failures.json``); ``None``
        writes nothing and caches nothing.
    quiet:
        No progress bar.
    """
    cfgs = [dict(c) for c in configs]
    for c in cfgs:
        _check_kind(c)
        json.dumps(c)  # configurations must be JSON (their hash and cache depend on it)
    cache = None if out is None else _cache_folder(out)
    outcomes: dict[int, dict[str, Any]] = {}
    todo: list[int] = []
    for i, c in enumerate(cfgs):
        path = None if cache is None else cache / f"{config_hash(c)}.json"
        metrics = None if path is None or not path.exists() else _read_cached(path)
        if metrics is not None:
            outcomes[i] = {"ok": True, "metrics": metrics}
        else:
            todo.append(i)
    if todo:
        results = _compute([cfgs[i] for i in todo], client, quiet)
        for i, res in zip(todo, results, strict=True):
            outcomes[i] = res
            if cache is not None and res["ok"]:
                _write_json(
                    cache / f"{config_hash(cfgs[i])}.json",
                    {"config": cfgs[i], "metrics": res["metrics"]},
                )
    full = [_with_defaults(c) for c in cfgs]
    rows = [{**full[i], **outcomes[i]["metrics"]} for i in range(len(cfgs)) if outcomes[i]["ok"]]
    failures = [
        {**full[i], "error": outcomes[i]["error"]}
        for i in range(len(cfgs))
        if not outcomes[i]["ok"]
    ]
    result = GridResult(
        rows=rows,
        failures=failures,
        computed=len(todo),
        reused=len(cfgs) - len(todo),
        path=None if out is None else str(out),
        columns=_columns(full, [o["metrics"] for o in outcomes.values() if o["ok"]]),
    )
    if out is not None:
        result.to_csv(Path(out) / "results.csv")
        try:
            result.to_parquet(Path(out) / "results.parquet")
        except ImportError:
            pass
        _write_json(Path(out) / "failures.json", failures)
    return result


def _cache_folder(out: str | os.PathLike[str]) -> Path:
    """``out/cache``, created; ValueError (not a traceback) when ``out`` is a file."""
    base = Path(out)
    if base.exists() and not base.is_dir():
        raise ValueError(f"out must be a folder, got {str(base)!r}: a file")
    try:
        (base / "cache").mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ValueError(
            f"out={str(base)!r}: cannot create {base / 'cache'}: {err.strerror}"
        ) from None
    return base / "cache"


def _read_cached(path: Path) -> dict[str, Any] | None:
    """The metrics cached in ``path``, or None (with a RuntimeWarning naming the file, which is
    then recomputed) when it is empty, truncated or holds no metrics."""
    try:
        metrics = json.loads(path.read_text()).get("metrics")
        problem = None if isinstance(metrics, dict) else "no 'metrics' object"
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError) as err:
        problem = f"{type(err).__name__}: {err}"
    if problem is None:
        return metrics  # type: ignore[no-any-return]
    warnings.warn(
        f"cached run {path} is damaged ({problem}); recomputing it", RuntimeWarning, stacklevel=3
    )
    return None


def _write_json(path: Path, obj: Any) -> None:
    """Atomic write: a temporary file in the same folder, then a rename."""
    tmp = path.with_name(f".tmp-{os.getpid()}-{path.name}")
    tmp.write_text(json.dumps(obj, indent=1, sort_keys=True))
    os.replace(tmp, path)


def _compute(cfgs: list[dict[str, Any]], client: Any, quiet: bool) -> list[dict[str, Any]]:
    keys = [f"pl-grid-{config_hash(c)}" for c in cfgs]
    if client is None or client in _LOCAL:
        tasks = [
            dask.delayed(_task, pure=True)(c, dask_key_name=k)
            for c, k in zip(cfgs, keys, strict=True)
        ]
        scheduler = client or "processes"
        if quiet:
            return list(dask.compute(*tasks, scheduler=scheduler))
        with local_progress(len(tasks)):
            return list(dask.compute(*tasks, scheduler=scheduler))
    from distributed import Client, progress

    if isinstance(client, str):
        with Client(client, timeout=_progress.CONNECT_TIMEOUT) as own:
            return _compute(cfgs, own, quiet)
    if not isinstance(client, Client):
        raise ValueError(
            f"client must be None, {_LOCAL}, a scheduler address or a dask.distributed.Client, "
            f"got {client!r}"
        )
    futures = client.map(_task, cfgs, key=keys)
    if not quiet and is_terminal():
        progress(futures)
    out = []
    for fut in futures:
        try:
            out.append(fut.result())
        except Exception as err:  # the task itself never raises: a lost worker, a cancellation
            out.append({"ok": False, "error": f"{type(err).__name__}: {err}"})
    return out
