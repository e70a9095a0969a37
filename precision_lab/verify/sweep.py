"""Exhaustive verification sweeps on Dask: every input bit pattern cast and compared with an oracle.

:func:`verify_exhaustive` walks every float32 (2**32), float16 or bfloat16 (2**16) bit pattern in
chunks, one Dask task per chunk; each task rounds its inputs with :func:`~precision_lab.round_to`
and encodes them with :func:`~precision_lab.encode` in every requested (mode, overflow) pair, and
compares values and codes with an independent oracle (:mod:`precision_lab.verify.oracles`: the fast
``"referee"``, ``"ml_dtypes"``, ``"torch"``, or any callable with the same signature). It returns
the mismatch counts and the first mismatches of each chunk.

Where it runs. ``client=None`` (the default) runs the tasks on Dask's local threaded scheduler:
nothing to start, no process spawning or pickling, and the work is numpy and native code that
releases the GIL, so threads use the machine fully. Each task runs precision_lab single-threaded
(:func:`~precision_lab.core.pool.use_workers`), so the parallelism is Dask's (workers x threads),
not Dask's times the rounding core's own thread pool. ``client`` may also be a scheduler address
(``"tcp://host:8786"``: a ``dask.distributed.Client`` is opened and closed around the sweep) or any
``dask.distributed.Client`` (a ``LocalCluster``, a cluster of many machines): the chunks are then
``client.map`` tasks, and a worker that dies mid-sweep costs only its running chunks, which the
scheduler recomputes elsewhere.

Checkpoints. With ``out=DIR`` every finished chunk is written at once to its own small JSON file
under ``DIR/<sweep key>/`` (written to a temporary file, then renamed: a file is either complete
or absent). A rerun with
the same parameters reads the finished chunks and submits only the others, so an interrupted
2**32 sweep resumes where it stopped. The sweep key names the format, input, oracle and subnormal
switch and hashes every parameter, the package version and the oracle's behaviour
(:func:`oracle_fingerprint`: its bytecode, constants, defaults, closure and the globals it reads,
functions there recursively), so two different lambdas, or a fixed oracle, never reuse each
other's results; an oracle that cannot be keyed so is refused with ``out=`` unless the caller
names its behaviour (``oracle_key=``). A damaged chunk file (empty, truncated, not the record of
its chunk) is named in a RuntimeWarning and in :attr:`SweepResult.damaged`, and recomputed. Chunk
files are named by their bit-pattern range ``lo-hi``, so a slice and the full sweep share them.
With a distributed client the files are written by the client as results arrive, so the workers
need no shared file system.

Needs the ``[dask]`` extra: ``pip install "precision_lab[dask]"``.

>>> r = verify_exhaustive("e4m3", input="bfloat16", against="ml_dtypes",
...                       overflow=("ieee", "saturate"), chunk=2**15, quiet=True)
>>> r.ok, r.checked, r.counts["nearest_even", "saturate"]
(True, 65536, {'values': 0, 'codes': 0})
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import operator
import os
import re
import tempfile
import threading
import time
import types
import uuid
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from ..core.codec import encode
from ..core.formats import FloatFormat, get_format
from ..core.pool import use_workers
from ..core.rounding import check_choice, check_rounding, round_to
from ..core.version import __version__
from . import progress as _progress
from .oracles import ORACLES, nan_codes
from .progress import is_terminal, local_progress

INSTALL = 'pip install "precision_lab[dask]"'
try:
    import dask
except ImportError as err:  # pragma: no cover - depends on the environment
    raise ImportError(f"precision_lab.verify.sweep needs Dask: {INSTALL}") from err

__all__ = [
    "INPUTS",
    "SweepResult",
    "SweepSpec",
    "UntrustedOracle",
    "check_chunk",
    "oracle_fingerprint",
    "verify_exhaustive",
]

#: input kinds: name -> (bits, numpy type of the patterns)
INPUTS: dict[str, tuple[int, Any]] = {
    "float32": (32, np.float32),
    "float16": (16, np.float16),
    "bfloat16": (16, ml_dtypes.bfloat16),
}
_UINT = {32: np.uint32, 16: np.uint16}
#: Dask's local schedulers, accepted as ``client``
_LOCAL = ("threads", "processes", "sync")


@dataclass(frozen=True)
class SweepSpec:
    """What every chunk task needs (small and picklable)."""

    fmt: FloatFormat
    input: str
    against: str | Callable[..., tuple[np.ndarray, np.ndarray]]
    keys: tuple[tuple[str, str], ...]
    subnormals: str
    max_examples: int
    oracle_key: str | None = None


@dataclass
class SweepResult:
    """Outcome of :func:`verify_exhaustive`.

    ``counts[mode, overflow]`` holds the number of inputs whose value (``"values"``) or code
    (``"codes"``) disagrees with the oracle; ``checked`` inputs were compared under every key,
    ``skipped`` were left out (NaN inputs of formats without NaN, which have no code for them).
    ``mismatches`` lists the first mismatches of each chunk; ``chunks`` every chunk's record.
    ``computed`` chunks ran in this call, ``reused`` came from checkpoints; ``damaged`` names
    the checkpoint files that could not be read (empty, truncated, not this chunk's record):
    they were recomputed and rewritten. ``seconds`` is the wall time of this call and
    ``elements_per_second`` its speed: input elements swept per second (computed chunks only;
    a speed, not a mismatch rate: ``ok`` and ``counts`` say what disagreed). ``rate`` is its
    deprecated old name.
    """

    fmt: str
    input: str
    against: str
    subnormals: str
    start: int
    stop: int
    chunk: int
    counts: dict[tuple[str, str], dict[str, int]]
    checked: int
    skipped: int
    mismatches: list[dict[str, Any]]
    chunks: list[dict[str, Any]] = field(repr=False)
    computed: int
    reused: int
    seconds: float
    path: str | None
    damaged: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when no value and no code disagrees with the oracle."""
        return all(c["values"] == 0 and c["codes"] == 0 for c in self.counts.values())

    @property
    def elements_per_second(self) -> float:
        """Input elements swept per second in this call (0 when everything was reused): the
        sweep's speed, not a mismatch rate."""
        done = sum(c["hi"] - c["lo"] for c in self.chunks if not c.get("reused"))
        return done / self.seconds if self.seconds > 0 and done else 0.0

    @property
    def rate(self) -> float:
        """Deprecated name of :attr:`elements_per_second` (it read like a mismatch rate)."""
        warnings.warn(
            "SweepResult.rate is deprecated: use elements_per_second (input elements swept per "
            "second, a speed)",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.elements_per_second

    def summary(self) -> str:
        """A few lines for a terminal or a log: the verdict, what was checked, the counts.

        >>> r = verify_exhaustive("e5m2", input="float16", against="ml_dtypes", stop=2**12,
        ...                       chunk=2**11, quiet=True)
        >>> print(r.summary().splitlines()[0])
        e5m2 from float16 patterns [0x0, 0x1000) against ml_dtypes: OK (no mismatch)
        """
        n_all = 1 << INPUTS[self.input][0]
        if (self.start, self.stop) == (0, n_all):
            span = f"all {n_all} {self.input} patterns"
        else:
            span = f"{self.input} patterns [{self.start:#x}, {self.stop:#x})"
        n_bad = sum(c["values"] + c["codes"] for c in self.counts.values())
        verdict = "OK (no mismatch)" if self.ok else f"MISMATCHES ({n_bad} in all)"
        skipped = f", {self.skipped} NaN inputs skipped (no NaN in {self.fmt})"
        speed = (
            f"; {self.seconds:.1f} s, {self.elements_per_second / 1e6:.1f} Melem/s"
            if self.computed
            else f"; {self.seconds:.1f} s"
        )
        lines = [
            f"{self.fmt} from {span} against {self.against}: {verdict}",
            f"  {self.checked} inputs checked{skipped if self.skipped else ''}, "
            f"each under {len(self.counts)} (mode, overflow) pair(s)",
            f"  {self.computed} chunks computed, {self.reused} reused from checkpoints{speed}",
        ]
        if self.path is not None:
            lines.append(f"  checkpoints: {self.path}")
        for path in self.damaged:
            lines.append(f"  damaged checkpoint recomputed: {path}")
        for (mode, overflow), c in self.counts.items():
            lines.append(
                f"  {mode:13s} {overflow:8s} value mismatches {c['values']}, "
                f"code mismatches {c['codes']}"
            )
        for m in self.mismatches[:10]:
            lines.append(f"  e.g. {m}")
        if len(self.mismatches) > 10:
            lines.append(f"  ... {len(self.mismatches) - 10} more examples in .mismatches")
        return "\n".join(lines)


# ----- one chunk ---------------------------------------------------------------------------------
def _patterns(kind: str, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """Bit patterns ``lo..hi-1`` of input kind ``kind`` and the floats they encode."""
    bits, dtype = INPUTS[kind]
    u = np.arange(lo, hi, dtype=_UINT[bits])
    return u, u.view(dtype)


def _same_values(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Bitwise identity of values (sign of zero included), any NaN matching any NaN."""
    dt = np.result_type(got.dtype, want.dtype)
    g, w = got.astype(dt, copy=False), want.astype(dt, copy=False)
    u = np.uint64 if dt.itemsize == 8 else np.uint32
    same = g.view(u) == w.view(u)
    odd = np.flatnonzero(~same)
    same[odd] = np.isnan(g[odd]) & np.isnan(w[odd])
    return same


def _same_codes(got: np.ndarray, want: np.ndarray, f: FloatFormat) -> np.ndarray:
    """Code identity, any NaN code matching any NaN code of the same sign."""
    same = got == want.astype(got.dtype, copy=False)
    odd = np.flatnonzero(~same)
    g, w = got[odd], want[odd].astype(got.dtype)
    sign = (g.astype(np.uint64) ^ w.astype(np.uint64)) >> np.uint64(f.bits - 1)
    same[odd] = nan_codes(g, f) & nan_codes(w, f) & (sign == 0)
    return same


def check_chunk(spec: SweepSpec, lo: int, hi: int) -> dict[str, Any]:
    """Compare round_to and encode with the oracle on the bit patterns ``lo..hi-1``.

    Pure: the result (a JSON-safe dict) depends on the arguments only. It is what each Dask task
    computes and what each checkpoint file holds. The patterns are checked in blocks of
    ``_BLOCK``: a task's chunk (2**24 patterns by default) sets the granularity of scheduling
    and checkpoints, while the arrays of a block stay small enough to be reused by the
    allocator (arrays of 2**24 elements are fresh pages from the kernel each time, and
    zeroing them cost several times the casts themselves) and to stay in cache.
    """
    checked = skipped = 0
    counts = {f"{m}/{o}": [0, 0] for m, o in spec.keys}
    examples: dict[str, list[dict[str, Any]]] = {key: [] for key in counts}
    for a in range(lo, hi, _BLOCK):
        n, k = _check_block(spec, a, min(a + _BLOCK, hi), counts, examples)
        checked += n
        skipped += k
    # the first mismatches, key by key (each key's in input order), max_examples in all
    firsts = [e for key in counts for e in examples[key]][: spec.max_examples]
    return {
        "lo": lo,
        "hi": hi,
        "checked": checked,
        "skipped": skipped,
        "mismatches": counts,
        "examples": firsts,
    }


#: patterns per block of check_chunk (1 MiB per float32 array: reused by malloc, in L2 cache)
_BLOCK = 1 << 18


def _check_block(
    spec: SweepSpec,
    lo: int,
    hi: int,
    counts: dict[str, list[int]],
    examples: dict[str, list[dict[str, Any]]],
) -> tuple[int, int]:
    """check_chunk on ``lo..hi-1``, adding to ``counts`` and ``examples``; (checked, skipped)."""
    u, x = _patterns(spec.input, lo, hi)
    f = spec.fmt
    skipped = 0
    if f.nan == "none":  # no NaN in the format: NaN inputs have no result to compare
        keep = ~np.isnan(x)
        skipped = int(keep.size - np.count_nonzero(keep))
        u, x = u[keep], x[keep]
    x32 = x.astype(np.float32, copy=False)  # exact; what the oracles get
    oracle = ORACLES[spec.against] if isinstance(spec.against, str) else spec.against
    for mode, overflow in spec.keys:
        sub = spec.subnormals
        got = round_to(x, f, rounding=mode, overflow=overflow, subnormals=sub)
        got_codes = encode(x, f, rounding=mode, overflow=overflow, subnormals=sub)
        want, want_codes = oracle(x32, f, mode=mode, overflow=overflow, subnormals=spec.subnormals)
        with np.errstate(all="ignore"):
            ok_v = _same_values(got, np.asarray(want))
            ok_c = _same_codes(got_codes, np.asarray(want_codes), f)
        key = f"{mode}/{overflow}"
        counts[key][0] += int(ok_v.size - np.count_nonzero(ok_v))
        counts[key][1] += int(ok_c.size - np.count_nonzero(ok_c))
        room = spec.max_examples - len(examples[key])
        for i in np.flatnonzero(~(ok_v & ok_c))[: max(room, 0)]:
            examples[key].append(
                {
                    "bits": f"{int(u[i]):#x}",
                    "x": repr(float(x32[i])),
                    "mode": mode,
                    "overflow": overflow,
                    "got": repr(float(got[i])),
                    "want": repr(float(want[i])),
                    "got_code": f"{int(got_codes[i]):#x}",
                    "want_code": f"{int(want_codes[i]):#x}",
                }
            )
    return int(x.size), skipped


# ----- checkpoints -------------------------------------------------------------------------------
def _write_atomic(path: Path, record: dict[str, Any]) -> None:
    """Write JSON to ``path`` through a temporary file in the same folder and a rename."""
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(record, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _chunk_file(folder: Path, lo: int, hi: int) -> Path:
    return folder / f"{lo:09x}-{hi:09x}.json"


def _run_chunk(spec: SweepSpec, lo: int, hi: int, folder: str | None) -> dict[str, Any]:
    """The task: check one chunk (single-threaded: Dask runs the tasks in parallel),
    checkpoint it when ``folder`` is given (local runs)."""
    with use_workers(1):
        record = check_chunk(spec, lo, hi)
    if folder is not None:
        _write_atomic(_chunk_file(Path(folder), lo, hi), record)
    return record


def _oracle_name(against: Any) -> str:
    if isinstance(against, str):
        return against
    mod = getattr(against, "__module__", "")
    return f"{mod}.{getattr(against, '__qualname__', type(against).__name__)}"


class UntrustedOracle(ValueError):
    """The oracle's behaviour cannot be keyed (see :func:`oracle_fingerprint`)."""


_SIMPLE = (type(None), bool, int, float, complex, str, bytes)


def _fingerprint(obj: Any, seen: set[int], depth: int = 0) -> Any:
    """A JSON-able description of ``obj`` that changes with what it does; UntrustedOracle for
    objects whose behaviour cannot be described (their repr would be an address)."""
    if depth > 40:
        raise UntrustedOracle("the oracle's references nest too deeply")
    if isinstance(obj, _SIMPLE) or isinstance(obj, np.generic):
        return repr(obj)
    if isinstance(obj, tuple | list | frozenset | set):
        items = [_fingerprint(v, seen, depth + 1) for v in obj]
        return [
            type(obj).__name__,
            sorted(map(repr, items)) if isinstance(obj, set | frozenset) else items,
        ]
    if isinstance(obj, dict):
        return ["dict", [[repr(k), _fingerprint(v, seen, depth + 1)] for k, v in obj.items()]]
    if isinstance(obj, np.ndarray):
        return ["ndarray", str(obj.dtype), obj.shape, hashlib.sha256(obj.tobytes()).hexdigest()]
    if isinstance(obj, types.ModuleType):
        return ["module", obj.__name__, str(getattr(obj, "__version__", ""))]
    if isinstance(obj, type):
        return ["type", obj.__module__, obj.__qualname__]
    if isinstance(obj, re.Pattern):
        return ["re", obj.pattern, obj.flags]
    if isinstance(obj, types.BuiltinFunctionType | np.ufunc):
        return [
            "builtin",
            getattr(obj, "__module__", None) or "",
            obj.__qualname__ if hasattr(obj, "__qualname__") else obj.__name__,
        ]
    if isinstance(obj, functools.partial):
        return [
            "partial",
            _fingerprint(obj.func, seen, depth + 1),
            _fingerprint(obj.args, seen, depth + 1),
            _fingerprint(obj.keywords, seen, depth + 1),
        ]
    if isinstance(obj, types.MethodType):
        return [
            "method",
            _fingerprint(obj.__func__, seen, depth + 1),
            _fingerprint(obj.__self__, seen, depth + 1),
        ]
    if isinstance(obj, types.FunctionType):
        name = f"{obj.__module__}.{obj.__qualname__}"
        if id(obj) in seen:  # recursion: the name stands for the function
            return ["function", name]
        seen.add(id(obj))
        wrapped = getattr(obj, "__wrapped__", None)  # functools.cache and the like
        code = obj.__code__
        glob = obj.__globals__
        refs = {
            n: _fingerprint(glob[n], seen, depth + 1)
            for n in sorted(_code_names(code))
            if n in glob
        }
        cells = [_fingerprint(c.cell_contents, seen, depth + 1) for c in obj.__closure__ or ()]
        return [
            "function",
            name,
            _code_fingerprint(code),
            _fingerprint(obj.__defaults__, seen, depth + 1),
            _fingerprint(obj.__kwdefaults__, seen, depth + 1),
            cells,
            refs,
            None if wrapped is None else _fingerprint(wrapped, seen, depth + 1),
        ]
    if dataclasses.is_dataclass(obj):  # formats, option records: their fields
        fields = {fl.name: getattr(obj, fl.name) for fl in dataclasses.fields(obj)}
        return [
            "dataclass",
            _fingerprint(type(obj), seen, depth + 1),
            _fingerprint(fields, seen, depth + 1),
        ]
    wrapped = getattr(obj, "__wrapped__", None)
    if isinstance(wrapped, types.FunctionType):  # functools.cache, lru_cache wrappers
        return ["wrapped", _fingerprint(wrapped, seen, depth + 1)]
    raise UntrustedOracle(
        f"the oracle refers to a {type(obj).__name__} object, whose behaviour cannot be keyed"
    )


def _code_names(code: types.CodeType) -> set[str]:
    """Global names a code object (and the code objects nested in it) may read."""
    names = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            names |= _code_names(c)
    return names


def _code_fingerprint(code: types.CodeType) -> str:
    """Hash of a code object: bytecode, constants (nested code included), names, arguments."""
    h = hashlib.sha256()
    for part in (
        code.co_code,
        code.co_names,
        code.co_varnames,
        code.co_freevars,
        code.co_argcount,
        code.co_kwonlyargcount,
        code.co_flags,
    ):
        h.update(repr(part).encode())
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            text = _code_fingerprint(c)
        elif isinstance(c, frozenset):  # `x in {...}`: its repr's order follows str hashes
            text = repr(sorted(map(repr, c)))
        else:
            text = repr(c)
        h.update(text.encode())
    return h.hexdigest()


def oracle_fingerprint(against: str | Callable[..., Any]) -> str:
    """A hash that changes with the oracle's behaviour: what checkpoints are keyed by.

    It covers the oracle function's bytecode and constants, its default arguments, the values in
    its closure and the global names it reads (functions there recursively: an oracle that
    wraps :func:`~precision_lab.verify.oracles.referee` changes its key when the referee's code
    changes), so two lambdas that do different things never share checkpoints, while the same
    oracle in a new process finds its own. Named oracles (``"referee"`` ...) are keyed by their
    function the same way. Raises :class:`UntrustedOracle` (a ValueError) when the oracle holds
    or reads an object whose behaviour cannot be described (an instance with ``__call__``, an
    open file ...): such a key cannot be trusted, so :func:`verify_exhaustive` refuses that
    oracle with ``out=``.

    >>> oracle_fingerprint(lambda x, fmt, **kw: 1) != oracle_fingerprint(lambda x, fmt, **kw: 2)
    True
    """
    fn = ORACLES[against] if isinstance(against, str) else against
    description = _fingerprint(fn, set())
    return hashlib.sha256(json.dumps(description, sort_keys=True).encode()).hexdigest()


def _sweep_key(spec: SweepSpec, chunk: int) -> str:
    f = spec.fmt
    ident = {
        "fmt": repr(f),
        "input": spec.input,
        "against": _oracle_name(spec.against),
        "oracle": spec.oracle_key or oracle_fingerprint(spec.against),
        "keys": spec.keys,
        "subnormals": spec.subnormals,
        "max_examples": spec.max_examples,
        "chunk": chunk,
        "version": __version__,
        "record": _RECORD_VERSION,
    }
    digest = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:12]
    name = f.name or f"e{f.exponent_bits}m{f.mantissa_bits}"
    tag = "".join(c if c.isalnum() else "_" for c in _oracle_name(spec.against))[-40:]
    return f"{name}-{spec.input}-{tag}-{spec.subnormals}-{digest}"


#: version of the chunk record layout (part of the sweep key)
_RECORD_VERSION = 2


def _read_checkpoint(path: Path, spec: SweepSpec, lo: int, hi: int) -> dict[str, Any] | None:
    """The chunk record in ``path``, or None (with a warning naming the file) when the file is
    damaged: empty, truncated, not JSON, or not the record of this chunk and these keys."""
    try:
        record = json.loads(path.read_text())
        problem = _record_problem(record, spec, lo, hi)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        problem = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
    if problem is None:
        return dict(record)
    warnings.warn(
        f"checkpoint {path} is damaged ({problem}); recomputing chunk [{lo:#x}, {hi:#x})",
        RuntimeWarning,
        stacklevel=3,
    )
    return None


def _record_problem(record: Any, spec: SweepSpec, lo: int, hi: int) -> str | None:
    """What is wrong with a chunk record read from a checkpoint (None: nothing)."""
    if not isinstance(record, dict):
        return f"not a JSON object but {type(record).__name__}"
    for name in ("lo", "hi", "checked", "skipped"):
        if not (isinstance(record.get(name), int) and not isinstance(record.get(name), bool)):
            return f"{name!r} missing or not an integer"
    if (record["lo"], record["hi"]) != (lo, hi):
        return f"it holds chunk [{record['lo']:#x}, {record['hi']:#x})"
    if not 0 <= record["checked"] + record["skipped"] <= hi - lo:
        return "its counts exceed the chunk"
    counts = record.get("mismatches")
    if not isinstance(counts, dict):
        return "'mismatches' missing"
    for m, o in spec.keys:
        c = counts.get(f"{m}/{o}")
        if not (
            isinstance(c, list)
            and len(c) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in c)
        ):
            return f"no mismatch counts for {m}/{o}"
    if not isinstance(record.get("examples"), list):
        return "'examples' missing"
    return None


# ----- the sweep ---------------------------------------------------------------------------------
def _as_tuple(value: str | Sequence[str], name: str) -> tuple[str, ...]:
    items = (value,) if isinstance(value, str) else tuple(value)
    if not items:
        raise ValueError(f"{name} must name at least one choice, got {value!r}")
    return items


def _ranges(start: int, stop: int, chunk: int) -> list[tuple[int, int]]:
    """Chunk ranges aligned to multiples of ``chunk`` (so slices share checkpoints)."""
    out = []
    lo = start
    while lo < stop:
        hi = min((lo // chunk + 1) * chunk, stop)
        out.append((lo, hi))
        lo = hi
    return out


def verify_exhaustive(
    fmt: str | FloatFormat,
    *,
    modes: str | Sequence[str] = ("nearest_even",),
    overflow: str | Sequence[str] = ("ieee",),
    subnormals: str = "keep",
    against: str | Callable[..., tuple[np.ndarray, np.ndarray]] = "referee",
    input: str = "float32",
    chunk: int = 2**24,
    start: int = 0,
    stop: int | None = None,
    client: Any = None,
    out: str | os.PathLike[str] | None = None,
    max_examples: int = 8,
    quiet: bool = False,
    oracle_key: str | None = None,
) -> SweepResult:
    """Check round_to and encode on every ``input`` bit pattern against an oracle.

    Parameters
    ----------
    fmt:
        The target format (a name or a :class:`~precision_lab.FloatFormat`).
    modes, overflow, subnormals:
        Deterministic rounding modes and overflow switches to check (a name or a sequence; every
        pair is checked), and the subnormal switch.
    against:
        ``"referee"`` (fast exact float64 referee, every mode), ``"ml_dtypes"`` or ``"torch"``
        (nearest_even, both overflow switches; see :mod:`precision_lab.verify.oracles`), or a
        callable ``f(x, fmt, *, mode, overflow, subnormals) -> (values, codes)`` taking float32
        inputs (picklable when a distributed client runs it).
    input:
        ``"float32"`` (2**32 patterns), ``"float16"`` or ``"bfloat16"`` (2**16 each).
    chunk, start, stop:
        Patterns per task (boundaries at multiples of ``chunk``) and the slice
        ``[start, stop)`` of bit patterns to sweep (default: all of them).
    client:
        ``None`` or ``"threads"``: Dask's threaded scheduler in this process; ``"processes"``
        or ``"sync"``: Dask's other local schedulers; a scheduler address string; or a
        ``dask.distributed.Client``.
    out:
        Checkpoint folder (see the module docstring); ``None`` keeps nothing.
    max_examples:
        Mismatches recorded per chunk.
    quiet:
        No progress bar (else ``dask.diagnostics.ProgressBar`` locally,
        ``distributed.progress`` with a client).
    oracle_key:
        With ``out``: a string that stands for the oracle's behaviour in the checkpoint key,
        instead of :func:`oracle_fingerprint` (for oracles it cannot key, such as callable
        objects or functions that read a lock or a counter). The caller vouches that the same
        key means the same answers: change it whenever the oracle changes.

    Returns
    -------
    SweepResult
    """
    f = get_format(fmt)
    if not isinstance(f, FloatFormat):
        raise ValueError(f"fmt must be a floating-point format, got {f}")
    check_choice("input", input, tuple(INPUTS))
    check_choice("subnormals", subnormals, ("keep", "flush"))
    mode_list = tuple(check_rounding(m) for m in _as_tuple(modes, "modes"))
    if "stochastic" in mode_list:
        raise ValueError("modes must be deterministic: stochastic rounding has no single answer")
    overflows = tuple(
        check_choice("overflow", o, ("ieee", "saturate")) for o in _as_tuple(overflow, "overflow")
    )
    if isinstance(against, str):
        check_choice("against", against, tuple(ORACLES))
    elif not callable(against):
        raise ValueError(f"against must be one of {tuple(ORACLES)} or a callable, got {against!r}")
    n_patterns = 1 << INPUTS[input][0]
    chunk = _as_index(chunk, "chunk")
    start = _as_index(start, "start")
    stop = n_patterns if stop is None else _as_index(stop, "stop")
    if chunk < 1:
        raise ValueError(f"chunk must be an integer >= 1, got {chunk!r}")
    if not (0 <= start < stop <= n_patterns):
        raise ValueError(
            f"start and stop must satisfy 0 <= start < stop <= {n_patterns} for {input} input, "
            f"got start={start}, stop={stop}"
        )
    max_examples = _as_index(max_examples, "max_examples")
    spec = SweepSpec(
        fmt=f,
        input=input,
        against=against,
        keys=tuple((m, o) for m in mode_list for o in overflows),
        subnormals=subnormals,
        max_examples=max_examples,
        oracle_key=oracle_key,
    )
    if oracle_key is not None and not (isinstance(oracle_key, str) and oracle_key):
        raise ValueError(f"oracle_key must be a non-empty str or None, got {oracle_key!r}")
    folder: Path | None = None
    if out is not None:
        try:
            key = _sweep_key(spec, chunk)
        except UntrustedOracle as err:
            raise UntrustedOracle(
                f"against={_oracle_name(against)} cannot be keyed for checkpoints ({err}); pass "
                "a plain function (its code, closure and the globals it reads are hashed), "
                "name its behaviour with oracle_key=, or run without out="
            ) from None
        folder = _checkpoint_folder(out, key)
    t0 = time.perf_counter()
    done: dict[tuple[int, int], dict[str, Any]] = {}
    todo: list[tuple[int, int]] = []
    damaged: list[str] = []
    for lo, hi in _ranges(start, stop, chunk):
        path = None if folder is None else _chunk_file(folder, lo, hi)
        record = None
        if path is not None and path.exists():
            record = _read_checkpoint(path, spec, lo, hi)
            if record is None:
                damaged.append(str(path))
        if record is not None:
            done[lo, hi] = {**record, "reused": True}
        else:
            todo.append((lo, hi))
    if todo:
        records = _compute(spec, todo, client, folder, quiet)
        done.update({(r["lo"], r["hi"]): r for r in records})
    seconds = time.perf_counter() - t0
    return _gather(
        spec,
        start,
        stop,
        chunk,
        [done[k] for k in sorted(done)],
        seconds,
        folder,
        computed=len(todo),
        damaged=damaged,
    )


def _as_index(value: Any, name: str) -> int:
    """``value`` as a Python int (numpy integers accepted); ValueError naming ``name`` else."""
    if isinstance(value, bool | np.bool_):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise ValueError(
            f"{name} must be an integer, got {value!r} ({type(value).__name__})"
        ) from None


def _checkpoint_folder(out: str | os.PathLike[str], key: str) -> Path:
    """``out/key``, created; ValueError (not a traceback) when ``out`` is a file or unusable."""
    base = Path(out)
    if base.exists() and not base.is_dir():
        raise ValueError(f"out must be a folder for the checkpoints, got {str(base)!r}: a file")
    folder = base / key
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ValueError(
            f"out={str(base)!r}: cannot create the checkpoint folder {folder}: {err.strerror}"
        ) from None
    return folder


def _compute(
    spec: SweepSpec,
    todo: list[tuple[int, int]],
    client: Any,
    folder: Path | None,
    quiet: bool,
) -> list[dict[str, Any]]:
    """Run the chunks of ``todo`` as Dask tasks; return their records."""
    if client is None or client in _LOCAL:
        where = None if folder is None else str(folder)
        tasks = [
            dask.delayed(_run_chunk, pure=True)(spec, lo, hi, where, dask_key_name=f"chunk-{lo:x}")
            for lo, hi in todo
        ]
        scheduler = client or "threads"
        if quiet:
            return list(dask.compute(*tasks, scheduler=scheduler))
        with local_progress(len(tasks)):
            return list(dask.compute(*tasks, scheduler=scheduler))
    from distributed import Client

    if isinstance(client, str):
        with Client(client, timeout=_progress.CONNECT_TIMEOUT) as own:
            return _on_client(own, spec, todo, folder, quiet)
    if not isinstance(client, Client):
        raise ValueError(
            f"client must be None, {_LOCAL}, a scheduler address or a dask.distributed.Client, "
            f"got {client!r}"
        )
    return _on_client(client, spec, todo, folder, quiet)


def _on_client(
    client: Any, spec: SweepSpec, todo: list[tuple[int, int]], folder: Path | None, quiet: bool
) -> list[dict[str, Any]]:
    """``client.map`` over the chunks; checkpoints are written here as results arrive."""
    from distributed import progress

    try:
        tag = _sweep_key(spec, 0)
    except UntrustedOracle:  # no key can stand for this oracle: keys of this call only
        tag = uuid.uuid4().hex
    futures = client.map(
        _run_chunk,
        [spec] * len(todo),
        [lo for lo, _ in todo],
        [hi for _, hi in todo],
        [None] * len(todo),
        key=[f"pl-sweep-{tag}-{lo:x}-{hi:x}" for lo, hi in todo],
    )

    saved = {fut.key: threading.Event() for fut in futures}

    def save(fut: Any) -> None:  # runs on the client as each result arrives
        try:
            if folder is not None and fut.status == "finished":
                record = fut.result()
                _write_atomic(_chunk_file(folder, record["lo"], record["hi"]), record)
        finally:
            saved[fut.key].set()

    for fut in futures:
        fut.add_done_callback(save)
    if not quiet and is_terminal():
        progress(futures)
    records: list[dict[str, Any]] = client.gather(futures)
    for event in saved.values():  # let the last callbacks finish their files
        event.wait(timeout=60)
    if folder is not None:  # and write any a callback could not
        for r in records:
            path = _chunk_file(folder, r["lo"], r["hi"])
            if not path.exists():
                _write_atomic(path, r)
    return records


def _gather(
    spec: SweepSpec,
    start: int,
    stop: int,
    chunk: int,
    records: list[dict[str, Any]],
    seconds: float,
    folder: Path | None,
    *,
    computed: int,
    damaged: list[str],
) -> SweepResult:
    counts = {key: {"values": 0, "codes": 0} for key in spec.keys}
    for r in records:
        for (mode, overflow), c in counts.items():
            v, k = r["mismatches"][f"{mode}/{overflow}"]
            c["values"] += v
            c["codes"] += k
    f = spec.fmt
    return SweepResult(
        fmt=f.name or str(f),
        input=spec.input,
        against=_oracle_name(spec.against),
        subnormals=spec.subnormals,
        start=start,
        stop=stop,
        chunk=chunk,
        counts=counts,
        checked=sum(r["checked"] for r in records),
        skipped=sum(r["skipped"] for r in records),
        mismatches=[e for r in records for e in r["examples"]],
        chunks=records,
        computed=computed,
        reused=len(records) - computed,
        seconds=seconds,
        path=None if folder is None else str(folder),
        damaged=damaged,
    )
