"""Flush-to-zero and denormals-are-zero switched on in the calling thread, as a fast-math library
(or ``torch.set_flush_denormal(True)``) leaves it: the native code must not depend on the caller's
SSE control register."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import sys
from collections.abc import Iterator

import numpy as np
import pytest


@contextlib.contextmanager
def ftz_daz() -> Iterator[None]:
    """FTZ and DAZ on while inside; afterwards asserts they were still on (nothing reset them)."""
    if sys.platform != "linux" or os.uname().machine != "x86_64":
        pytest.skip("glibc on x86-64 only (fenv_t with the SSE control register at offset 28)")
    libm = ctypes.CDLL(ctypes.util.find_library("m"))
    tiny = np.full(4, 2.0**-140, np.float32)
    env = (ctypes.c_uint32 * 8)()  # glibc's fenv_t on x86-64: 32 bytes, MXCSR the last word
    assert libm.fegetenv(env) == 0
    saved = (ctypes.c_uint32 * 8)(*env)
    try:
        env[7] |= 0x8040  # flush-to-zero and denormals-are-zero
        libm.fesetenv(env)
        assert (tiny * np.float32(1)).sum() == 0, "FTZ/DAZ did not take effect"
        yield
        still = (tiny * np.float32(1)).sum() == 0
    finally:
        libm.fesetenv(saved)
    assert still, "the caller's FTZ/DAZ setting was not restored"
