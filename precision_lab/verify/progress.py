"""Running a sweep or grid on Dask: the scheduler connection's timeout, and progress (a live bar
on a terminal, plain lines in a log).

A ``\\r``-updated bar written into a captured log (CI, ``nohup``, a notebook's stored output)
becomes one long garbled line; so where stdout is not a terminal, progress is a few plain lines
(at each quarter of the tasks) instead.

>>> import io
>>> out = io.StringIO()
>>> with local_progress(4, stream=out):
...     pass
>>> out.getvalue()
''
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

__all__ = ["CONNECT_TIMEOUT", "is_terminal", "local_progress"]

#: how long connecting to a scheduler address may take before it is an error (dask's default,
#: 30 s, left a mistyped address hanging that long)
CONNECT_TIMEOUT = "10s"


def is_terminal(stream: TextIO | None = None) -> bool:
    """Whether ``stream`` (default: stdout) is an interactive terminal."""
    s = sys.stdout if stream is None else stream
    try:
        return bool(s.isatty())
    except (AttributeError, ValueError):
        return False


def _plain_progress(total: int, stream: TextIO | None) -> Any:
    """A dask local-scheduler callback that prints ``done k of n tasks (t s)`` at each quarter
    (dask is the optional ``[dask]`` extra: imported here, when a sweep or grid runs)."""
    from dask.callbacks import Callback

    class PlainProgress(Callback):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.total = max(int(total), 1)
            self.done = 0
            self.marks = {(self.total * q + 3) // 4 for q in (1, 2, 3, 4)}
            self.t0 = time.perf_counter()

        def _posttask(self, key: Any, result: Any, dsk: Any, state: Any, worker: Any) -> None:
            self.done += 1
            if self.done in self.marks:
                took = time.perf_counter() - self.t0
                out = sys.stdout if stream is None else stream
                print(f"done {self.done} of {self.total} tasks ({took:.1f} s)", file=out)

    return PlainProgress()


@contextmanager
def local_progress(total: int, stream: TextIO | None = None) -> Iterator[None]:
    """Progress of ``total`` tasks on a local dask scheduler: dask's bar on a terminal, a few
    plain lines otherwise."""
    if is_terminal(stream):
        from dask.diagnostics import ProgressBar

        with ProgressBar():
            yield
    elif total > 1:
        with _plain_progress(total, stream):
            yield
    else:
        yield
