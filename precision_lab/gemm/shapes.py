"""Shape rules of ``gemm``, shared by the numpy reference and the CuPy backend."""

from __future__ import annotations

from ..core.shapes import broadcast_shapes


def gemm_shapes(
    a_shape: tuple[int, ...], b_shape: tuple[int, ...]
) -> tuple[tuple[int, ...], int, int, int]:
    """``(batch, M, K, N)`` of ``a @ b`` for a (..., M, K) and b (..., K, N), batches broadcast.

    >>> gemm_shapes((2, 3, 4), (4, 5))
    ((2,), 3, 4, 5)
    >>> gemm_shapes((3, 4), (5, 6))
    Traceback (most recent call last):
    ...
    ValueError: shape mismatch: a is (3, 4) (K=4) but b is (5, 6) (K=5); a.shape[-1] must ...
    """
    if len(a_shape) < 2:
        raise ValueError(f"a must be at least 2-D (..., M, K), got shape {a_shape}")
    if len(b_shape) < 2:
        raise ValueError(f"b must be at least 2-D (..., K, N), got shape {b_shape}")
    if a_shape[-1] != b_shape[-2]:
        raise ValueError(
            f"shape mismatch: a is {a_shape} (K={a_shape[-1]}) but b is {b_shape} "
            f"(K={b_shape[-2]}); a.shape[-1] must equal b.shape[-2]"
        )
    try:
        batch = broadcast_shapes(a_shape[:-2], b_shape[:-2])
    except ValueError:
        raise ValueError(
            f"batch shapes of a {a_shape[:-2]} and b {b_shape[:-2]} do not broadcast"
        ) from None
    return batch, a_shape[-2], a_shape[-1], b_shape[-1]
