"""Steps from epochs: the one arithmetic that the config checks and the training loop share.

It imports nothing of the runner, so :mod:`experiments.axes` (which
:mod:`experiments.config` imports) and :mod:`experiments.train` (which imports
:mod:`experiments.config`) both read it without an import circle.
"""

from __future__ import annotations

import math

__all__ = ["steps_per_epoch"]


def steps_per_epoch(n_train: int, batch_size: int) -> int:
    """Number of optimizer steps per epoch (the last batch may be short)."""
    return max(1, math.ceil(n_train / batch_size))
