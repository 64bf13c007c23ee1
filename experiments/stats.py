"""Intervals and paired tests for the findings of a sweep (the study notebooks state a claim only when these say so).

Runs of a sweep share their seeds across methods: seed ``s`` gives every method
the same initial weights and the same data order. A comparison of two methods
is therefore *paired* by seed, and :func:`paired` gives the mean difference
with its 95% confidence interval and the two-sided paired t-test (Student's t
on the per-seed differences). :func:`mean_ci` gives one cell's mean with its
t interval. With 5 seeds the t quantile is 2.776, so an interval is about
1.24 standard deviations of the seeds each side of the mean.

Runs that share no initial weights (two architectures, e.g. a pruned
LeNet-300-100 and a narrower dense one) are compared unpaired by :func:`welch`.

The rule every study here states its claims by (issue 37): a claim "A beats B
by d points" holds when its two-sided p-value, adjusted by :func:`holm` over the
family of comparisons it belongs to, is below 0.05 and d has the claimed sign;
otherwise it is "not established" (which says nothing about there being no
difference). Intervals are reported unadjusted, for size.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Iterable

import numpy as np
import pandas as pd

__all__ = ["Interval", "Paired", "mean_ci", "paired", "paired_table", "welch", "holm", "CONFIDENCE"]

CONFIDENCE = 0.95


@dataclasses.dataclass(frozen=True)
class Interval:
    """A mean and its two-sided t confidence interval.

    Attributes:
        mean: The sample mean.
        low, high: The interval's ends (NaN with fewer than 2 values).
        n: Number of values.
    """

    mean: float
    low: float
    high: float
    n: int

    @property
    def half_width(self) -> float:
        """Half the interval's width."""
        return (self.high - self.low) / 2.0

    def excludes(self, value: float = 0.0) -> bool:
        """Whether ``value`` lies outside the interval (False when the interval is undefined)."""
        return bool(self.low > value or self.high < value)

    def __str__(self) -> str:
        return f"{self.mean:.4f} [{self.low:.4f}, {self.high:.4f}] (n={self.n})"


@dataclasses.dataclass(frozen=True)
class Paired(Interval):
    """:class:`Interval` of the per-seed differences ``a - b``, with the paired t-test.

    Attributes:
        p_value: Two-sided p-value of the paired t-test (NaN with fewer than 2 pairs,
            1.0 when every difference is 0).
        wins: Seeds where ``a > b``.
        ties: Seeds where ``a == b``.
    """

    p_value: float = math.nan
    wins: int = 0
    ties: int = 0


def _t_quantile(confidence: float, dof: int) -> float:
    from scipy import stats

    return float(stats.t.ppf(0.5 + confidence / 2.0, dof))


def mean_ci(values: Iterable[float], confidence: float = CONFIDENCE) -> Interval:
    """The mean of ``values`` with its two-sided Student-t confidence interval.

    Args:
        values: Finite numbers (one per seed).
        confidence: In (0, 1).

    Raises:
        ValueError: ``confidence`` out of range, no values, or a value that is not finite.
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    x = np.asarray(list(values), dtype=np.float64)
    if x.size == 0:
        raise ValueError("values is empty: an interval needs at least one value")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"values must be finite, got {x.tolist()!r}")
    m = float(x.mean())
    if x.size < 2:
        return Interval(m, math.nan, math.nan, int(x.size))
    half = _t_quantile(confidence, x.size - 1) * float(x.std(ddof=1)) / math.sqrt(x.size)
    return Interval(m, m - half, m + half, int(x.size))


def paired(a: pd.Series, b: pd.Series, confidence: float = CONFIDENCE) -> Paired:
    """``a - b`` paired by index (the seed), its mean, interval and paired t-test.

    Args:
        a, b: One value per seed, indexed by seed; only seeds in both count.

    Raises:
        ValueError: no seed in common, or :func:`mean_ci`'s errors.
    """
    common = a.index.intersection(b.index)
    if len(common) == 0:
        raise ValueError(f"a and b share no index value (a: {list(a.index)}, b: {list(b.index)})")
    d = (a.loc[common].astype(float) - b.loc[common].astype(float)).to_numpy()
    ci = mean_ci(d, confidence)
    if d.size < 2:
        p = math.nan
    elif np.all(d == 0):
        p = 1.0
    else:
        from scipy import stats

        p = float(stats.ttest_1samp(d, 0.0).pvalue)
    return Paired(ci.mean, ci.low, ci.high, ci.n, p, int((d > 0).sum()), int((d == 0).sum()))


def paired_table(
    runs: pd.DataFrame, by: str, a: str, b: str, value: str = "test_accuracy", at: str = "target_sparsity"
) -> pd.DataFrame:
    """One row per ``at`` value: :func:`paired` of ``value`` for ``by == a`` against ``by == b``, by seed.

    Columns: ``at``, ``diff``, ``low``, ``high``, ``p_value``, ``wins``, ``ties``, ``n``.
    """
    rows = []
    for level, cell in runs.groupby(at):
        x = cell[cell[by] == a].set_index("seed")[value]
        y = cell[cell[by] == b].set_index("seed")[value]
        if len(x) and len(y):
            r = paired(x, y)
            rows.append({at: level, "diff": r.mean, "low": r.low, "high": r.high, "p_value": r.p_value,
                         "wins": r.wins, "ties": r.ties, "n": r.n})
    return pd.DataFrame(rows)


def welch(a: Iterable[float], b: Iterable[float], confidence: float = CONFIDENCE) -> Paired:
    """``mean(a) - mean(b)`` for unpaired samples: Welch's interval and t-test (unequal variances).

    The interval uses the Welch-Satterthwaite degrees of freedom. ``wins`` and
    ``ties`` are left at 0 (there are no pairs).

    Raises:
        ValueError: fewer than 2 values on a side, or values that are not finite.
    """
    x, y = (np.asarray(list(v), dtype=np.float64) for v in (a, b))
    if x.size < 2 or y.size < 2:
        raise ValueError(f"welch needs at least 2 values on each side, got {x.size} and {y.size}")
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
        raise ValueError("values must be finite")
    vx, vy = x.var(ddof=1) / x.size, y.var(ddof=1) / y.size
    d = float(x.mean() - y.mean())
    se = math.sqrt(vx + vy)
    if se == 0.0:
        return Paired(d, d, d, int(x.size + y.size), 1.0 if d == 0 else 0.0)
    dof = (vx + vy) ** 2 / (vx**2 / (x.size - 1) + vy**2 / (y.size - 1))
    half = _t_quantile(confidence, dof) * se
    from scipy import stats

    p = float(stats.ttest_ind(x, y, equal_var=False).pvalue)
    return Paired(d, d - half, d + half, int(x.size + y.size), p)


def holm(p_values: Iterable[float]) -> np.ndarray:
    """Holm's step-down adjusted p-values, in the order given (Holm 1979, "A simple sequentially rejective
    multiple test procedure", Scand. J. Statist. 6:65-70).

    Sorted ascending, the i-th smallest of m p-values becomes ``max over j <= i of min(1, (m - j + 1) * p_(j))``.
    A claim whose adjusted p is below ``a`` holds with the family's error rate at most ``a``. Holm keeps that
    guarantee under any dependence between the tests, and rejects at least what Bonferroni does.

    Args:
        p_values: One p-value per claim of the family, each in [0, 1].

    Raises:
        ValueError: no p-values, or one that is NaN or outside [0, 1].
    """
    p = np.asarray(list(p_values), dtype=np.float64)
    if p.size == 0:
        raise ValueError("p_values must hold at least one p-value, got none")
    bad = [float(v) for v in p if not 0.0 <= v <= 1.0]
    if bad:
        raise ValueError(f"p_values must each be in [0, 1], got {bad}")
    order = np.argsort(p, kind="stable")
    m = p.size
    stepped = np.minimum(1.0, (m - np.arange(m)) * p[order])
    adjusted = np.empty(m)
    adjusted[order] = np.maximum.accumulate(stepped)
    return adjusted
