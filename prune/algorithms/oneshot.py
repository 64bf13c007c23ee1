"""Pruning after training, in one shot from calibration data: the base, the streamed input statistics, magnitude.

A one-shot method prunes a trained model once, layer by layer. :func:`prune.oneshot` runs it: it records each
pruned layer's inputs on the calibration batches, with the layers before it already pruned, into an
:class:`InputStatistics`, and hands each weight to :meth:`OneShotPruning.plan` as an
:class:`~prune.algorithms.base.Update` whose ``weight`` and ``keep`` are the 2-D view ``W`` of shape
``[d_in, d_out]`` (``y = x W``: a Dense kernel as it is, a Conv2D kernel as its patch matrix
``[kh * kw * C_in, C_out]``, an attention projection with its contracted axes flattened) and whose ``inputs``
holds the statistics of ``x``. The plan comes back in the same view: a keep-mask, and new values for a method
that also updates the kept weights (SparseGPT).

NumPy only (float64). Three methods, one file each, registered with kind ``"oneshot"``:

==============  ==============================================  =======================================
name            score, and what else changes                    reference
==============  ==============================================  =======================================
``magnitude``   ``|W|``                                         (the baseline of both papers)
``wanda``       ``|W_ij| * ||X_j||_2``                          Sun et al. 2024
``sparsegpt``   ``W_ij^2 / [H^-1]_jj^2``, the kept weights      Frantar and Alistarh 2023
                updated to reconstruct ``X W`` (OBS)
==============  ==============================================  =======================================

Patterns: unstructured (``sparsity``), or :class:`prune.NByM` (``m`` zeros in every ``n`` consecutive inputs
of each output, the groups of :class:`prune.NByM` on a Dense kernel). Scopes, for unstructured sparsity: over
the whole layer (``"layer"``: exactly ``round(sparsity * d_in * d_out)`` zeros, the count of every prune
schedule) or within each output (``"row"``, Wanda's comparison group: ``round(sparsity * d_in)`` zeros per
output). Entries already pruned stay pruned, ranked below every live one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple, Sequence

import numpy as np

from prune.algorithms.base import MaskAlgorithm, Update, _fraction, register_algorithm
from prune.core.patterns import NByM, Unstructured, num_zeros

__all__ = ["InputStatistics", "OneShotPlan", "OneShotPruning", "Magnitude", "SCOPES", "STATISTICS"]

SCOPES = ("layer", "row")
"""Where unstructured one-shot sparsity is counted: over the whole weight, or within each output's inputs."""
STATISTICS = ("none", "norms", "gram")
"""What a method reads of a layer's inputs: nothing, ``sum_t x_tj^2`` per input (Wanda), or ``X^T X`` (SparseGPT)."""


_CHUNK = 256
"""Rows of inputs, and columns of the Gram matrix, that :meth:`InputStatistics.add` works on at a time."""


@dataclass
class InputStatistics:
    """Statistics of one layer's inputs ``X`` (``[tokens, d_in]``), accumulated batch by batch in float64.

    Only these are kept, never the activations: ``d_in`` floats for the norms, and ``d_in * d_in`` for the Gram
    matrix when ``gram`` is asked for (8 MB at ``d_in = 1024``).

    Attributes:
        d_in: Input features.
        with_gram: Whether :attr:`gram` is accumulated.
        tokens: Rows of ``X`` seen so far.
        sq_norms: ``sum over tokens of x_j^2`` per input feature ``j``.
        gram: ``X^T X`` (``None`` unless ``with_gram``). SparseGPT's ``H = 2 X^T X / n`` up to a scale, which
            changes neither its masks nor its weights.
    """

    d_in: int
    with_gram: bool = False
    tokens: int = 0
    sq_norms: np.ndarray = field(default=None, repr=False)  # type: ignore[assignment]
    gram: np.ndarray | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.d_in, bool) or not isinstance(self.d_in, (int, np.integer)) or self.d_in < 1:
            raise ValueError(f"d_in must be a positive integer, got {self.d_in!r}")
        self.d_in = int(self.d_in)
        if self.sq_norms is None:
            self.sq_norms = np.zeros(self.d_in)
        if self.with_gram and self.gram is None:
            self.gram = np.zeros((self.d_in, self.d_in))

    def add(self, x: Any) -> None:
        """Accumulate one batch of inputs, ``[tokens, d_in]`` (any float dtype).

        Raises:
            ValueError: a batch of another width, or with NaN or infinite entries (nothing is added).
        """
        x = np.asarray(x)
        if x.ndim != 2 or x.shape[1] != self.d_in:
            raise ValueError(f"inputs must have shape [tokens, {self.d_in}], got {tuple(x.shape)}")
        bad = sum(int((~np.isfinite(x[r:r + _CHUNK])).sum()) for r in range(0, x.shape[0], _CHUNK))
        if bad:
            raise ValueError(f"inputs hold {bad} NaN or infinite entries")
        self.tokens += int(x.shape[0])
        for r in range(0, x.shape[0], _CHUNK):  # float64 a slab at a time: no float64 copy of the whole batch
            c = np.asarray(x[r:r + _CHUNK], dtype=np.float64)
            self.sq_norms += np.einsum("tj,tj->j", c, c)
            if self.gram is not None:
                for j in range(0, self.d_in, _CHUNK):  # X^T X a column slab at a time: no d_in x d_in temporary
                    self.gram[:, j:j + _CHUNK] += c.T @ c[:, j:j + _CHUNK]

    @property
    def nbytes(self) -> int:
        """Bytes held (the norms, and the Gram matrix if any)."""
        return int(self.sq_norms.nbytes + (0 if self.gram is None else self.gram.nbytes))


class OneShotPlan(NamedTuple):
    """One weight's one-shot result: its keep-mask and ``n``, the entries newly pruned (as
    :class:`~prune.algorithms.base.Planned`), and ``weight``, new values for the whole weight when the method
    also changes the kept ones (SparseGPT's reconstruction; pruned entries 0.0), else ``None``. All in the
    ``[d_in, d_out]`` view."""

    keep: np.ndarray
    n: int
    weight: np.ndarray | None = None


def select_lowest(scores: np.ndarray, sparsity: float, pattern: NByM | None, scope: str,
                  keep: np.ndarray | None = None) -> np.ndarray:
    """Keep-mask of the ``[d_in, d_out]`` ``scores`` with the lowest ones pruned, by ``pattern`` and ``scope``.

    Ties prune the lower index first (a stable sort: C order over the layer, the input index within an output).
    Entries that ``keep`` marks pruned rank below every live one and stay pruned.
    """
    s = np.asarray(scores, np.float64)
    if keep is not None and not np.all(keep):  # (an all-live keep changes no rank: no masked copy)
        s = np.where(np.asarray(keep, bool), s, -np.inf)
    if pattern is not None:
        return pattern.select(s, previous=keep)  # groups along axis -2: d_in
    if scope == "layer":
        out = np.ones(s.size, bool)
        out[np.argsort(s.reshape(-1), kind="stable")[: num_zeros(sparsity, s.size)]] = False
        new = out.reshape(s.shape)
    else:
        new = np.ones(s.shape, bool)
        order = np.argsort(s, axis=0, kind="stable")[: num_zeros(sparsity, s.shape[0])]
        np.put_along_axis(new, order, False, axis=0)
    return new if keep is None else new & np.asarray(keep, bool)


class OneShotPruning(MaskAlgorithm):
    """Base of the one-shot methods: prune each weight once to ``sparsity`` (or ``pattern``) by :meth:`scores`.

    A subclass sets :attr:`name`, :attr:`statistics` and :meth:`scores` (the entries of lowest score are
    pruned), or overrides :meth:`prune_weight` where it also changes the weights (SparseGPT). Its own
    keyword arguments are listed in :attr:`~prune.algorithms.base.MaskAlgorithm.own_params`.

    Args:
        sparsity: Fraction of each weight's entries pruned, in [0, 1). With an :class:`prune.NByM` pattern it
            must be ``None`` or the pattern's ``m / n``.
        pattern: ``None`` or :class:`prune.Unstructured` (unstructured), or :class:`prune.NByM`.
        scope: ``"layer"`` or ``"row"`` (:data:`SCOPES`); default the method's :attr:`default_scope`.

    Raises:
        ValueError: a bad argument, naming it and its value.
    """

    kind = "oneshot"
    statistics: ClassVar[str] = "none"
    """One of :data:`STATISTICS`: what :func:`prune.oneshot` records of each layer's inputs for this method."""
    default_scope: ClassVar[str] = "layer"

    def __init__(self, sparsity: float | None = 0.5, pattern: Any = None, scope: str | None = None) -> None:
        if pattern is not None and type(pattern) is Unstructured:
            if getattr(pattern, "keep_one", False):
                raise ValueError("pattern Unstructured(keep_one=True) has no one-shot form; use Unstructured()")
            pattern = None
        if pattern is not None and not isinstance(pattern, NByM):
            raise ValueError(f"pattern must be None, prune.Unstructured() or prune.NByM(m, n) for one-shot "
                             f"pruning, got {pattern!r}")
        if isinstance(pattern, NByM):
            if sparsity is not None and not np.isclose(float(sparsity), pattern.sparsity):
                raise ValueError(f"sparsity must be None or {pattern.sparsity:g} (m / n) with pattern {pattern!r}, "
                                 f"got {sparsity!r}")
            sparsity = pattern.sparsity
        if sparsity is None:
            raise ValueError("sparsity must be a number in [0, 1) without an N:M pattern, got None")
        self.sparsity = _fraction("sparsity", sparsity, 0.0, 1.0, False, "[0, 1)")
        if self.sparsity >= 1.0:
            raise ValueError(f"sparsity must be a number in [0, 1), got {sparsity!r}")
        self.pattern: NByM | None = pattern
        scope = self.default_scope if scope is None else scope
        if scope not in SCOPES:
            raise ValueError(f"scope must be one of {list(SCOPES)} for one-shot pruning, got {scope!r}")
        self.scope = scope

    def __repr__(self) -> str:
        return f"{type(self).__name__}(sparsity={self.sparsity!r}, pattern={self.pattern!r}, scope={self.scope!r})"

    def check(self, updates: Sequence[Update]) -> None:
        """As the base's, plus: each weight is 2-D (the ``[d_in, d_out]`` view), its inputs' statistics are
        there when :attr:`statistics` needs them, of its ``d_in``, and finite."""
        super().check(updates)
        for u in updates:
            if np.ndim(u.weight) != 2 or np.shape(u.keep) != np.shape(u.weight):
                raise ValueError(f"weight {u.key!r}: a one-shot method takes the 2-D view [d_in, d_out] and a keep-mask "
                                 f"of its shape, got {np.shape(u.weight)} and {np.shape(u.keep)}")
            if self.statistics == "none":
                continue
            st = u.inputs
            if not isinstance(st, InputStatistics) or st.tokens == 0:
                raise ValueError(f"method {self.name!r} needs the inputs of {u.key!r} on calibration data; none were recorded")
            if st.d_in != np.shape(u.weight)[0]:
                raise ValueError(f"weight {u.key!r} has {np.shape(u.weight)[0]} inputs, its statistics {st.d_in}")
            if self.statistics == "gram" and st.gram is None:
                raise ValueError(f"method {self.name!r} needs the Gram matrix of the inputs of {u.key!r}")

    def scores(self, u: Update) -> np.ndarray:
        """Higher is kept; the base's is ``|W|`` (magnitude). ``u.weight`` is the ``[d_in, d_out]`` view."""
        return np.abs(np.asarray(u.weight, np.float64))

    def prune_weight(self, u: Update) -> OneShotPlan:
        """One weight's keep-mask (and new values, for a method that changes them), after :meth:`check`."""
        keep = select_lowest(self.scores(u), self.sparsity, self.pattern, self.scope, u.keep)
        return OneShotPlan(keep, int(np.asarray(u.keep, bool).sum() - keep.sum()))

    def select(self, updates: Sequence[Update], step: int = 0) -> list[OneShotPlan]:  # type: ignore[override]
        """:meth:`prune_weight` of each weight, in order (``step`` is unused: one shot)."""
        return [self.prune_weight(u) for u in updates]


@register_algorithm
class Magnitude(OneShotPruning):
    """One-shot magnitude pruning: the entries of smallest ``|W|`` go, per layer (default) or per output.

    The baseline SparseGPT and Wanda are measured against (Frantar and Alistarh 2023, Table 1; Sun et al.
    2024, Table 2). It reads no calibration data.
    """

    name = "magnitude"
