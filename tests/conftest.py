"""Suite-wide settings: no test asserts on wall-clock time.

Hypothesis' per-example deadline (200 ms by default) is a wall-clock assertion that fails on a
loaded machine; it is switched off here for every test (the profile ``precision_lab``).
"""

from __future__ import annotations

from hypothesis import settings

settings.register_profile("precision_lab", deadline=None)
settings.load_profile("precision_lab")
