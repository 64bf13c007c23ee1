"""The warning category of ``prune``: things that run, but not as a user porting from tfmot may expect.

Plain Python (no TensorFlow), so that schedules and patterns can warn
without importing it. Filter them as any warning::

    warnings.simplefilter("error", prune.PruningWarning)   # in a test suite
    warnings.simplefilter("ignore", prune.PruningWarning)  # once understood
"""

from __future__ import annotations

__all__ = ["PruningWarning"]


class PruningWarning(UserWarning):
    """A model, schedule or mask that will not do what its arguments suggest.

    Raised as a warning (never an error) for: layers with weights that stay
    dense, a schedule whose final sparsity is never reached, a weight emptied
    by exact rounding (tfmot keeps one entry), and a layer shared with the
    original model because it cannot be copied.
    """
