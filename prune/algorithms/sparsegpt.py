"""SparseGPT: prune a layer in one shot and update its kept weights to reconstruct its output on calibration data.

Reference: Frantar and Alistarh, "SparseGPT: Massive Language Models Can Be Accurately Pruned in One-Shot",
ICML 2023, Algorithm 1, as their code runs it (``sparsegpt.py``, ``SparseGPT.fasterprune``):

* ``H = X^T X`` over the calibration tokens (the paper's ``2 X X^T / n``: a scale changes nothing below);
  inputs never seen (``H_jj = 0``) get ``H_jj = 1`` and their weights 0;
* dampening: ``percdamp`` times the mean of ``H``'s diagonal added to it;
* ``U``, the upper Cholesky factor of ``H^-1``;
* the columns (inputs) in blocks of ``blocksize``: at each block's start, the mask of the block from
  ``W^2 / diag(U)^2`` (the adaptive mask selection); for N:M, the ``m`` lowest of every ``n`` columns, chosen
  when the loop reaches the group's first column; then column by column, the pruned entries zeroed and the error
  ``(w - q) / U_ii`` spread over the block's later columns by ``U``'s row (the OBS update), and over the
  later blocks at the block's end (the lazy batch update).

Two choices differ from the authors' code, and are the same in :func:`sparsegpt_reference` (the tests'
transcription): the number pruned per block is ``round(s * (end)) - round(s * (start))`` of the entries so far
(their ``tmp <= sorted[int(numel * s)]`` prunes one more per block, and ties all together), so that the layer
ends with exactly ``round(s * n)`` zeros, the count of every prune schedule; and ties prune the lower index first.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from prune.algorithms.base import Update, _positive_int, register_algorithm
from prune.algorithms.oneshot import OneShotPlan, OneShotPruning
from prune.core.patterns import NByM, num_zeros

__all__ = ["SparseGPT", "sparsegpt_prune", "sparsegpt_reference", "inverse_hessian_factor"]


_BLOCK = 128
"""Rows and columns per block of the blocked Cholesky factorisation and triangular inverse below."""


def _cholesky_in_place(a: np.ndarray, block: int = _BLOCK) -> np.ndarray:
    """The lower Cholesky factor ``L`` of the symmetric ``a`` (its lower triangle is read), written over ``a``.

    Right-looking and blocked: each diagonal block is factored (``numpy.linalg.cholesky``), the panel below it
    solved against it, and the trailing lower triangle updated a column slab at a time. The temporaries are
    ``d x block``; ``numpy.linalg.cholesky(a)`` holds two more ``d x d`` buffers (a copy and the result).

    Raises:
        numpy.linalg.LinAlgError: ``a`` is not positive definite (``a`` is then partly overwritten).
    """
    n = a.shape[0]
    for k0 in range(0, n, block):
        k1 = min(k0 + block, n)
        lkk = np.linalg.cholesky(a[k0:k1, k0:k1])
        a[k0:k1, k0:k1] = lkk
        if k1 == n:
            break
        a[k1:, k0:k1] = a[k1:, k0:k1] @ np.linalg.inv(lkk).T  # L_ik = A_ik L_kk^-T
        panel = a[k1:, k0:k1]
        for j0 in range(k1, n, block):  # A_ij -= L_ik L_jk^T, on and below the diagonal only
            j1 = min(j0 + block, n)
            a[j0:, j0:j1] -= panel[j0 - k1:] @ panel[j0 - k1:j1 - k1].T
    for i in range(n - 1):
        a[i, i + 1:] = 0.0
    return a


def _lower_inverse(lower: np.ndarray, out: np.ndarray, block: int = _BLOCK) -> np.ndarray:
    """``L^-1`` of a lower-triangular ``L`` by blocked forward substitution, written into ``out`` (a view may be
    given: :func:`inverse_hessian_factor` writes through a reversed one).

    Block row ``I`` of ``L X = 1`` gives ``X_II = L_II^-1`` and ``X_IJ = -L_II^-1 (L_I,<I X_<I,J)`` for ``J < I``;
    the temporaries are ``block x d`` (``numpy.linalg.inv`` of the whole matrix holds three ``d x d`` buffers).
    """
    n = lower.shape[0]
    out[...] = 0.0
    for i0 in range(0, n, block):
        i1 = min(i0 + block, n)
        d = np.linalg.inv(lower[i0:i1, i0:i1])
        out[i0:i1, i0:i1] = np.tril(d)
        if i0:
            out[i0:i1, :i0] = -d @ (lower[i0:i1, :i0] @ out[:i0, :i0])
    return out


def inverse_hessian_factor(gram: np.ndarray, percdamp: float) -> tuple[np.ndarray, np.ndarray]:
    """``(U, dead)``: the upper Cholesky factor of ``(H + damp I)^-1`` and the inputs never seen.

    ``H`` is ``gram`` with ``H_jj = 1`` where ``gram_jj = 0``; ``damp = percdamp * mean(diag(H))``.

    ``U`` is found without forming ``H^-1``: with ``J`` the reversal of the axes, ``J H J = L L^T`` (Cholesky)
    gives ``H = V V^T`` with ``V = J L J`` upper triangular, so ``H^-1 = V^-T V^-1`` and ``U = V^-1 = J L^-1 J``
    (the upper Cholesky factor is unique). One blocked factorisation in place and one blocked triangular
    inverse: two ``d_in x d_in`` matrices are alive at once (16 MB at ``d_in = 1024``), where
    ``numpy.linalg.cholesky(numpy.linalg.inv(H))`` holds five.

    Raises:
        ValueError: ``gram`` not square, or not positive definite after dampening.
    """
    gram = np.asarray(gram)
    if gram.ndim != 2 or gram.shape[0] != gram.shape[1]:
        raise ValueError(f"gram must be a square matrix, got shape {gram.shape}")
    h = np.array(gram[::-1, ::-1], dtype=np.float64)  # J H J, a copy
    dead_rev = np.diag(h) == 0
    h[dead_rev, dead_rev] = 1.0
    h[np.diag_indices_from(h)] += percdamp * float(np.mean(np.diag(h)))
    try:
        lower = _cholesky_in_place(h)
    except np.linalg.LinAlgError as e:
        raise ValueError(f"the inputs' Hessian is not positive definite after dampening percdamp={percdamp!r} "
                         f"({e}); raise percdamp") from None
    upper = np.empty_like(lower)
    _lower_inverse(lower, upper[::-1, ::-1])  # J L^-1 J, written straight into U's order
    return upper, dead_rev[::-1].copy()


_ROWS = 256
"""Rows of ``W`` per slab of SparseGPT's lazy batch update (each slab's product is ``_ROWS x d_in`` floats)."""


def _block_counts(sparsity: float, rows: int, i1: int, i2: int, scope: str) -> int:
    """Entries pruned in columns ``[i1, i2)``: per row (``"row"``) or over every row (``"layer"``)."""
    if scope == "row":
        return num_zeros(sparsity, i2) - num_zeros(sparsity, i1)
    return num_zeros(sparsity, rows * i2) - num_zeros(sparsity, rows * i1)


def _block_mask(tmp: np.ndarray, k: int, scope: str) -> np.ndarray:
    """Bool ``[rows, cols]``, True where pruned: the ``k`` lowest of ``tmp`` (per row, or over the block)."""
    pruned = np.zeros(tmp.shape, bool)
    if scope == "row":
        np.put_along_axis(pruned, np.argsort(tmp, axis=1, kind="stable")[:, :k], True, axis=1)
    else:
        pruned.reshape(-1)[np.argsort(tmp.reshape(-1), kind="stable")[:k]] = True
    return pruned


def _group_mask(tmp: np.ndarray, pattern: NByM) -> np.ndarray:
    """Bool ``[rows, r]`` (``r <= n`` columns of one N:M group), True where pruned: the ``m`` lowest per row,
    or, in a last group of ``r < n`` columns, ``max(r - (n - m), 0)`` (what :class:`prune.NByM` keeps)."""
    r = tmp.shape[1]
    k = max(r - (pattern.n - pattern.m), 0)
    pruned = np.zeros(tmp.shape, bool)
    np.put_along_axis(pruned, np.argsort(tmp, axis=1, kind="stable")[:, :k], True, axis=1)
    return pruned


def sparsegpt_prune(kernel: np.ndarray, gram: np.ndarray, sparsity: float, pattern: NByM | None = None,
                    scope: str = "layer", blocksize: int = 128, percdamp: float = 0.01,
                    keep: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """SparseGPT on one ``[d_in, d_out]`` kernel (``y = x W``): ``(keep, new_kernel)``, pruned entries 0.0.

    Args:
        kernel: The weight view ``[d_in, d_out]``.
        gram: ``X^T X`` of its inputs, ``[d_in, d_in]``.
        sparsity: Fraction pruned (unstructured); ignored with ``pattern``.
        pattern: ``None``, or :class:`prune.NByM` (``m`` zeros in every ``n`` consecutive inputs per output).
        scope: ``"layer"`` (the block's mask over all outputs, as the paper) or ``"row"`` (per output).
        blocksize: Columns per lazy block (a multiple of ``pattern.n``).
        percdamp: Dampening, relative to the mean diagonal.
        keep: Entries already pruned (False) stay pruned and rank lowest.
    """
    u, dead = inverse_hessian_factor(gram, percdamp)  # first: its temporaries are gone before W's copy is made
    w = np.array(kernel, dtype=np.float64).T  # [rows = outputs, cols = inputs], as the paper's W
    rows, cols = w.shape
    w[:, dead] = 0.0
    old = None if keep is None else np.asarray(keep, bool).T
    pruned = np.zeros(w.shape, bool)
    for i1 in range(0, cols, blocksize):
        i2 = min(i1 + blocksize, cols)
        w1, u1 = w[:, i1:i2].copy(), u[i1:i2, i1:i2]
        d1 = np.diag(u1)
        err1 = np.zeros_like(w1)
        if pattern is None:
            tmp = w1**2 / d1[None, :] ** 2
            if old is not None:
                tmp = np.where(old[:, i1:i2], tmp, -np.inf)
            mask1 = _block_mask(tmp, _block_counts(sparsity, rows, i1, i2, scope), scope)
        else:
            mask1 = np.zeros(w1.shape, bool)
        for i in range(i2 - i1):
            if pattern is not None and (i1 + i) % pattern.n == 0:
                j = min(i + pattern.n, i2 - i1)
                tmp = w1[:, i:j] ** 2 / d1[None, i:j] ** 2
                if old is not None:
                    tmp = np.where(old[:, i1 + i:i1 + j], tmp, -np.inf)
                mask1[:, i:j] = _group_mask(tmp, pattern)
            if old is not None:
                mask1[:, i] |= ~old[:, i1 + i]
            col = w1[:, i]
            q = np.where(mask1[:, i], 0.0, col)
            e = (col - q) / u1[i, i]
            w1[:, i:] -= np.outer(e, u1[i, i:])
            w1[:, i] = q  # exactly 0.0 where pruned
            err1[:, i] = e
        w[:, i1:i2] = w1
        pruned[:, i1:i2] = mask1
        for r1 in range(0, rows, _ROWS):  # the lazy batch update, in row slabs: no [rows, cols] temporary
            w[r1:r1 + _ROWS, i2:] -= err1[r1:r1 + _ROWS] @ u[i1:i2, i2:]
    return ~pruned.T, w.T


def sparsegpt_reference(kernel: np.ndarray, gram: np.ndarray, sparsity: float, pattern: NByM | None = None,
                        scope: str = "layer", blocksize: int = 128, percdamp: float = 0.01) -> tuple[np.ndarray, np.ndarray]:
    """The paper's Algorithm 1 written plainly, for tests: every update applied at once to all later columns
    (no lazy blocks), ``H^-1`` by ``numpy.linalg.inv``; the masks chosen where :func:`sparsegpt_prune`
    chooses them. Same arguments and result."""
    w = np.array(kernel, dtype=np.float64).T
    rows, cols = w.shape
    h = np.array(gram, dtype=np.float64)
    dead = np.diag(h) == 0
    h[dead, dead] = 1.0
    h += percdamp * np.mean(np.diag(h)) * np.eye(cols)
    u = np.linalg.cholesky(np.linalg.inv(h)).T
    w[:, dead] = 0.0
    pruned = np.zeros(w.shape, bool)
    for i in range(cols):
        if pattern is None and i % blocksize == 0:
            i2 = min(i + blocksize, cols)
            tmp = w[:, i:i2] ** 2 / np.diag(u)[None, i:i2] ** 2
            pruned[:, i:i2] = _block_mask(tmp, _block_counts(sparsity, rows, i, i2, scope), scope)
        if pattern is not None and i % pattern.n == 0:
            j = min(i + pattern.n, cols)
            pruned[:, i:j] = _group_mask(w[:, i:j] ** 2 / np.diag(u)[None, i:j] ** 2, pattern)
        q = np.where(pruned[:, i], 0.0, w[:, i])
        e = (w[:, i] - q) / u[i, i]
        w[:, i:] -= np.outer(e, u[i, i:])
        w[:, i] = q
    return ~pruned.T, w.T


@register_algorithm
class SparseGPT(OneShotPruning):
    """SparseGPT (Frantar and Alistarh 2023): OBS pruning with the inverse Hessian of the layer's inputs.

    Prunes each weight to ``sparsity`` (or ``pattern``) and updates its kept entries to reconstruct the layer's
    output on the calibration inputs (:func:`sparsegpt_prune`).

    Args:
        sparsity, pattern, scope: As :class:`~prune.algorithms.oneshot.OneShotPruning`; ``scope="layer"``
            (the default, the paper's) chooses each block's mask over all outputs, ``"row"`` within each.
        blocksize: Columns per lazy batch update and adaptive mask block (the paper's ``B = 128``); a multiple
            of the N:M group length.
        percdamp: Dampening, a fraction of the mean diagonal of ``H`` (the paper's 1%), in (0, 1].

    Raises:
        ValueError: a bad argument, naming it and its value.
    """

    name = "sparsegpt"
    statistics = "gram"
    default_scope = "layer"
    own_params = {"blocksize": 128, "percdamp": 0.01}

    def __init__(self, sparsity: float | None = 0.5, pattern: Any = None, scope: str | None = None,
                 blocksize: int = 128, percdamp: float = 0.01) -> None:
        super().__init__(sparsity, pattern, scope)
        self.blocksize = _positive_int("blocksize", blocksize)
        if self.pattern is not None and self.blocksize % self.pattern.n:
            raise ValueError(f"blocksize must be a multiple of the N:M group length {self.pattern.n}, got {blocksize!r}")
        if isinstance(percdamp, bool) or not isinstance(percdamp, (int, float, np.floating)) or not 0.0 < percdamp <= 1.0:
            raise ValueError(f"percdamp must be a number in (0, 1], got {percdamp!r}")
        self.percdamp = float(percdamp)

    def prune_weight(self, u: Update) -> OneShotPlan:
        """The keep-mask and the reconstructed weight (:func:`sparsegpt_prune`)."""
        keep, w = sparsegpt_prune(u.weight, u.inputs.gram, self.sparsity, self.pattern, self.scope, self.blocksize,
                                  self.percdamp, keep=u.keep)
        return OneShotPlan(keep, int(np.asarray(u.keep, bool).sum() - keep.sum()), weight=w)
