"""Counter-based random bits for stochastic rounding.

Element ``i`` of an array rounded with seed ``s`` gets the 64-bit word ``i % 4`` of
Philox4x64-10 (Salmon et al. 2011) at counter ``(i // 4, 0, 0, 0)`` with key
``(s mod 2**64, s // 2**64)``. The word depends only on (seed, flat index), so results do not depend
on chunking, thread count or backend: the CUDA code computes the same words. numpy's own
``Philox`` bit generator produces exactly these words and is used on the CPU.

>>> random_words(5, 3, 0).tolist() == philox4x64((0, 0, 0, 0), (5, 0))[:3]
True
>>> bool((random_words(5, 2, 1) == random_words(5, 3, 0)[1:]).all())
True
"""

from __future__ import annotations

import secrets

import numpy as np

_M64 = (1 << 64) - 1


def check_seed(seed: int | None) -> int:
    """Validate a seed (an integer in [0, 2**128)); ``None`` draws a fresh one from the OS."""
    if seed is None:
        return secrets.randbits(128)
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer):
        raise TypeError(f"seed must be an int in [0, 2**128) or None, got {type(seed).__name__}")
    seed = int(seed)
    if not 0 <= seed < (1 << 128):
        raise ValueError(f"seed must be in [0, 2**128), got {seed}")
    return seed


def random_words(seed: int, n: int, start: int = 0) -> np.ndarray:
    """The 64-bit random words of flat indices ``start .. start + n - 1`` (uint64)."""
    block, skip = divmod(start, 4)
    gen = np.random.Philox(key=np.array([seed & _M64, seed >> 64], dtype=np.uint64))
    state = gen.state
    # numpy increments the counter before it generates: start one block early
    state["state"]["counter"] = np.array([(block - 1) & _M64] + [0] * 3, dtype=np.uint64)
    if block == 0:  # counter -1 is all ones (the increment carries through all four words)
        state["state"]["counter"][:] = _M64
    state["buffer_pos"] = 4
    gen.state = state
    return gen.random_raw(n + skip)[skip:]


def philox4x64(counter: tuple[int, int, int, int], key: tuple[int, int]) -> list[int]:
    """Plain-Python Philox4x64-10, the reference for the fast paths (and the CUDA code).

    >>> philox4x64((0, 0, 0, 0), (5, 7))[0]
    1404267366799308175
    """
    c = list(counter)
    k0, k1 = key
    for _ in range(10):
        p0 = 0xD2E7470EE14C6C93 * c[0]
        p1 = 0xCA5A826395121157 * c[2]
        c = [(p1 >> 64) ^ c[1] ^ k0, p1 & _M64, (p0 >> 64) ^ c[3] ^ k1, p0 & _M64]
        k0 = (k0 + 0x9E3779B97F4A7C15) & _M64
        k1 = (k1 + 0xBB67AE8584CAA73B) & _M64
    return c
