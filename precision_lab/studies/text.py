"""Number formatting shared by the studies' Markdown and the figure jobs' report sections."""

from __future__ import annotations

__all__ = ["signed"]


def signed(x: float, digits: int = 2) -> str:
    """``x`` with an explicit sign and ``digits`` decimals; a value that rounds to zero (either
    sign) prints as a plain ``0.00``, never ``-0.00`` or ``+0.00``.

    >>> signed(0.4444), signed(-1.5), signed(-0.0), signed(-0.001), signed(0.004, 3)
    ('+0.44', '-1.50', '0.00', '0.00', '+0.004')
    """
    text = f"{x:+.{digits}f}"
    if float(text) == 0.0:
        return f"{0.0:.{digits}f}"
    return text
