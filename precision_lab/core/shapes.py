"""Shape helpers that work for any number of dimensions.

numpy arrays may have up to 64 dimensions, but ``np.broadcast_shapes`` (through ``np.broadcast``)
stops at 32: :func:`broadcast_shapes` is the same rule in plain Python.

>>> broadcast_shapes((2, 1, 3), (4, 1))
(2, 4, 3)
>>> broadcast_shapes((1,) * 40, (5,))[-1]
5
"""

from __future__ import annotations

__all__ = ["broadcast_shapes"]


def broadcast_shapes(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    """The shape numpy's broadcasting gives ``shapes`` (ValueError if they do not broadcast).

    >>> broadcast_shapes((2, 3), (4, 3))
    Traceback (most recent call last):
    ...
    ValueError: shapes (2, 3) and (4, 3) do not broadcast
    """
    ndim = max((len(s) for s in shapes), default=0)
    out = [1] * ndim
    for s in shapes:
        for i, n in enumerate(s, ndim - len(s)):
            n = int(n)
            if n != out[i] and n != 1:
                if out[i] != 1:
                    raise ValueError(
                        f"shapes {' and '.join(str(tuple(t)) for t in shapes)} do not broadcast"
                    )
                out[i] = n
    return tuple(out)
