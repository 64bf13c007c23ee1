"""Sparsity patterns: which sets of entries are pruned together.

A pattern is a small immutable value stored in the layer's config and saved
with the model. Each one turns a weight's scores into a keep-mask, with the
rules of :mod:`prune.core.masks` applied pattern by pattern:

* **Exact counts.** A pattern with *units* (an entry, a block, an output
  channel) prunes exactly ``round(sparsity * units)`` units of a weight (round
  half to even); under global scope the total over all weights of the group is
  exact. :class:`NByM` has no units: its sparsity is ``m / n`` by construction.
  At high sparsity this can prune every unit of a small weight, which tfmot
  never does (it keeps ``max(round((1 - s) * n), 1)`` entries): give the
  pattern ``keep_one=True`` for tfmot's rule (``scope="layer"`` only), or read
  the :class:`prune.PruningWarning` that says which weight was emptied.
* **Deterministic ties.** Among equal scores the unit with the lower flat index
  is pruned first.
* **Masks only shrink.** A unit is alive while any of its entries is; dead
  units rank below every live one, entries pruned earlier stay pruned, and a
  target below the sparsity already reached leaves the mask as it is. This is
  a rule of schedules; dynamic sparse training (:mod:`prune.training.dst`) grows masks.

========================  =======================================  =====================
pattern                   unit                                     tfmot argument
========================  =======================================  =====================
``Unstructured()``        one entry                                default
``Block((r, c), "AVG")``  an ``r x c`` tile of a 2-D weight        ``block_size``,
                                                                   ``block_pooling_type``
``NByM(m, n)``            none: ``m`` zeros in every ``n``         ``sparsity_m_by_n``
                          consecutive entries along the input axis
``Channel()``             one output unit (last axis): a Dense     none
                          column, a Conv filter
========================  =======================================  =====================
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

__all__ = [
    "POOLINGS",
    "num_zeros",
    "Pattern",
    "Unstructured",
    "Block",
    "NByM",
    "Channel",
    "as_pattern",
    "serialize_pattern",
    "register_pattern",
    "patterns",
]


def num_zeros(sparsity: float, n: int) -> int:
    """How many of ``n`` units (entries, blocks, channels) are pruned at ``sparsity``: ``round(sparsity * n)``.

    The one home of the counting rule that masks, patterns, distributions and
    ``SparseDense`` share. The product is rounded half to even by
    ``numpy.round`` (as ``tf.math.round`` does): 0.5 of 5 units prunes 2,
    0.5 of 7 prunes 4. The product is computed in the type of ``sparsity``
    (a float32 schedule value stays float32), as every caller always did.

    Args:
        sparsity: Fraction of units to prune, in [0, 1).
        n: Number of units.

    Returns:
        The number of units to prune.

    Raises:
        ValueError: ``sparsity`` outside [0, 1).
    """
    if not (0.0 <= sparsity < 1.0):
        raise ValueError(f"sparsity must be in [0, 1), got {sparsity!r}")
    return int(np.round(sparsity * n))


def prune_lowest(scores: np.ndarray, alive: np.ndarray, k: int) -> np.ndarray:
    """Bool keep-vector with the ``k`` lowest-ranked units off.

    Dead units (``alive`` False) rank below every live one; among equal scores
    the lower index is pruned first (a stable sort).
    """
    ranked = np.where(alive, np.asarray(scores, np.float64), -np.inf)
    order = np.argsort(ranked, kind="stable")
    keep = np.ones(ranked.shape[0], dtype=bool)
    keep[order[:k]] = False
    return keep


class Pattern:
    """Base of the sparsity patterns.

    A pattern with units implements :meth:`units` (a score and an alive flag
    per unit) and :meth:`expand` (a keep flag per unit back to the weight's
    shape); :meth:`select` and global scope are then shared. A pattern without
    units (``NByM``) overrides :meth:`select` and sets ``has_units = False``.
    """

    has_units: ClassVar[bool] = True

    def check(self, shape: tuple[int, ...], where: str = "weight") -> None:
        """Raise ``ValueError`` naming ``where`` if the pattern cannot apply to ``shape``."""

    def units(self, scores: np.ndarray, previous: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(unit_scores, unit_alive)``, both 1-D, for one weight's scores and current mask."""
        raise NotImplementedError

    def expand(self, unit_keep: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        """A keep flag per unit, as a bool mask of ``shape``."""
        raise NotImplementedError

    def num_units(self, shape: tuple[int, ...]) -> int:
        """How many units a weight of ``shape`` has."""
        return int(self.units(np.zeros(shape), np.ones(shape, bool))[0].size)

    def select(self, scores: np.ndarray, sparsity: float, previous: np.ndarray | None = None) -> np.ndarray:
        """Keep-mask of ``scores``' shape with ``round(sparsity * units)`` units pruned.

        Args:
            scores: One weight's scores; higher is kept.
            sparsity: Target fraction of pruned units, in [0, 1).
            previous: The current mask (bool or 0/1); its zeros stay zeros.
        """
        scores = np.asarray(scores, np.float64)
        prev = np.ones(scores.shape, bool) if previous is None else np.asarray(previous).astype(bool)
        self.check(scores.shape)
        u_scores, alive = self.units(scores, prev)
        k = num_zeros(sparsity, u_scores.size)
        if getattr(self, "keep_one", False):
            k = min(k, u_scores.size - 1)  # tfmot's rule: at least one unit stays
        if k <= int((~alive).sum()):
            return prev.copy()
        return self.expand(prune_lowest(u_scores, alive, k), scores.shape) & prev

    def get_config(self) -> dict[str, Any]:
        # keep_one is left out at its default, so that configs saved before it existed compare equal.
        config = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}  # type: ignore[arg-type]
        if not config.get("keep_one", True):
            del config["keep_one"]
        return config

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "Pattern":
        return cls(**config)


def _check_keep_one(value: Any) -> None:
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"keep_one must be True or False, got {value!r}")


@dataclass(frozen=True)
class Unstructured(Pattern):
    """Any entry can be pruned on its own (tfmot's default, ``block_size=(1, 1)``).

    Args:
        keep_one: Keep at least one entry of each weight, as tfmot does
            (default ``False``: exactly ``round(sparsity * n)`` zeros, which
            can be all of a small weight).
    """

    keep_one: bool = False

    def __post_init__(self) -> None:
        _check_keep_one(self.keep_one)

    def units(self, scores: np.ndarray, previous: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return scores.reshape(-1), previous.reshape(-1)

    def expand(self, unit_keep: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        return unit_keep.reshape(shape)


POOLINGS = ("AVG", "MAX")
"""How :class:`Block` scores a tile: the mean or the largest of its entries' scores (tfmot's ``block_pooling_type``)."""


@dataclass(frozen=True)
class Block(Pattern):
    """``r x c`` tiles of a 2-D weight pruned together, ranked by their pooled score.

    tfmot's ``block_size``/``block_pooling_type``: the weight must be 2-D (a
    Dense kernel; tfmot's ``Pruning._validate_block`` refuses every other
    rank, a ``[1, 4, 4]`` or ``[1, 1, in, out]`` kernel too), is cut into
    tiles from the top-left corner, and each tile's scores are pooled by their
    mean (``"AVG"``) or maximum (``"MAX"``). Edge tiles are smaller; their
    mean is over their own entries (tfmot's ``SAME`` pooling). Unlike tfmot,
    which keeps every tile whose pooled score ties the threshold, exactly
    ``round(sparsity * tiles)`` tiles are pruned.

    Args:
        block_size: ``(r, c)`` positive integers.
        pooling: ``"AVG"`` (default, as tfmot) or ``"MAX"``.
        keep_one: Keep at least one tile of each weight, as tfmot does.
    """

    block_size: tuple[int, int] = (1, 1)
    pooling: str = "AVG"
    keep_one: bool = False

    def __post_init__(self) -> None:
        _check_keep_one(self.keep_one)
        size = self.block_size
        if (
            not isinstance(size, (tuple, list))
            or len(size) != 2
            or any(isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 1 for d in size)
        ):
            raise ValueError(f"block_size must be two positive integers (r, c), got {size!r}")
        object.__setattr__(self, "block_size", (int(size[0]), int(size[1])))
        if self.pooling not in POOLINGS:
            raise ValueError(f"block_pooling_type must be 'AVG' or 'MAX', got {self.pooling!r}")

    def _rows_cols(self, shape: tuple[int, ...], where: str = "weight") -> tuple[int, int]:
        if len(shape) != 2:
            raise ValueError(f"block_size={self.block_size} needs a 2-D weight, as in tfmot, but {where} has shape {tuple(shape)}")
        return (int(shape[0]), int(shape[1]))

    def check(self, shape: tuple[int, ...], where: str = "weight") -> None:
        self._rows_cols(shape, where)

    def units(self, scores: np.ndarray, previous: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        rows, cols = self._rows_cols(scores.shape)
        r, c = self.block_size
        nr, nc = -(-rows // r), -(-cols // c)
        pad = ((0, nr * r - rows), (0, nc * c - cols))
        s = np.pad(scores.reshape(rows, cols), pad, constant_values=np.nan).reshape(nr, r, nc, c)
        a = np.pad(previous.reshape(rows, cols), pad, constant_values=False).reshape(nr, r, nc, c)
        pooled = np.nanmean(s, axis=(1, 3)) if self.pooling == "AVG" else np.nanmax(s, axis=(1, 3))
        return pooled.reshape(-1), a.any(axis=(1, 3)).reshape(-1)

    def expand(self, unit_keep: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        rows, cols = self._rows_cols(shape)
        r, c = self.block_size
        nr, nc = -(-rows // r), -(-cols // c)
        full = np.repeat(np.repeat(unit_keep.reshape(nr, nc), r, axis=0), c, axis=1)
        return full[:rows, :cols].reshape(shape)


@dataclass(frozen=True)
class NByM(Pattern):
    """``m`` zeros in every ``n`` consecutive entries along the input axis (tfmot's ``sparsity_m_by_n``).

    ``NByM(2, 4)`` is tfmot's ``sparsity_m_by_n=(2, 4)``: 2 of every 4
    consecutive weights are zero, 50% sparsity. The groups run along axis
    ``-2`` of the kernel, its input dimension: ``in`` of a Dense ``[in, out]``
    kernel and ``in_channels`` of a Conv ``[..., in, out]`` kernel, the
    layout tfmot rearranges to (``weights_rearrange``: TFLite's last axis).
    Each output unit (and kernel position) thus has its own groups. When the
    input dimension is not a multiple of ``n``, the last group of ``r < n``
    entries keeps at most ``n - m`` of them (tfmot pads it with zeros).

    The scheduled sparsity is not used: whenever the schedule fires the mask is
    made ``m``-by-``n``, as in tfmot, so the schedule only says *when*. Within a
    group the lowest scores are pruned, ties to the lower index (tfmot's
    ``top_k`` keeps the lower index instead). Entries pruned earlier stay
    pruned, so a group may end with more than ``m`` zeros. ``NByM`` fixes every
    group's sparsity and so only works with ``scope="layer"``.

    Args:
        m: Zeros per group, ``0 <= m < n``.
        n: Group length, ``n >= 1``.
    """

    m: int = 2
    n: int = 4
    has_units: ClassVar[bool] = False

    def __post_init__(self) -> None:
        for name, v in (("m", self.m), ("n", self.n)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise ValueError(f"sparsity_m_by_n must be two integers (m, n), got {name}={v!r}")
        if not (0 <= self.m < self.n):
            raise ValueError(f"sparsity_m_by_n=(m, n) needs 0 <= m < n, got ({self.m}, {self.n})")
        object.__setattr__(self, "m", int(self.m))
        object.__setattr__(self, "n", int(self.n))

    @property
    def sparsity(self) -> float:
        """``m / n``."""
        return self.m / self.n

    def check(self, shape: tuple[int, ...], where: str = "weight") -> None:
        if len(shape) < 2:
            raise ValueError(f"sparsity_m_by_n needs a weight of rank >= 2 (groups run along axis -2), {where} has shape {tuple(shape)}")

    def select(self, scores: np.ndarray, sparsity: float = 0.0, previous: np.ndarray | None = None) -> np.ndarray:
        """Keep-mask with ``m`` of every ``n`` consecutive entries along axis -2 pruned (``sparsity`` unused)."""
        scores = np.asarray(scores, np.float64)
        self.check(scores.shape)
        prev = np.ones(scores.shape, bool) if previous is None else np.asarray(previous).astype(bool)
        d = scores.shape[-2]
        groups = -(-d // self.n)
        pad = groups * self.n - d
        # Rows of the input axis: [..., out, in] -> [rows, in], padded to a multiple of n.
        s = np.moveaxis(scores, -2, -1).reshape(-1, d)
        p = np.moveaxis(prev, -2, -1).reshape(-1, d)
        s = np.pad(s, ((0, 0), (0, pad))).reshape(-1, self.n)
        p = np.pad(p, ((0, 0), (0, pad))).reshape(-1, self.n)
        is_pad = np.pad(np.zeros((1, d), bool), ((0, 0), (0, pad)), constant_values=True).reshape(-1, self.n)
        is_pad = np.broadcast_to(np.tile(is_pad, (s.shape[0] // is_pad.shape[0], 1)), s.shape)
        # Rank per group: padding first, then entries pruned earlier, then live ones by score; stable by index.
        rank_class = np.where(is_pad, 0, np.where(p, 2, 1))
        live_score = np.where(p & ~is_pad, s, 0.0)
        order = np.lexsort((live_score, rank_class), axis=-1)
        keep = np.ones(s.shape, bool)
        np.put_along_axis(keep, order[:, : self.m], False, axis=-1)
        keep = keep.reshape(-1, groups * self.n)[:, :d]
        moved = np.moveaxis(prev, -2, -1).shape
        return np.moveaxis(keep.reshape(moved), -1, -2) & prev


@dataclass(frozen=True)
class Channel(Pattern):
    """Whole output units: a Dense column or a Conv filter (the kernel's last axis).

    A unit's score is the sum of its entries' scores, the L1 norm of the filter
    under the magnitude criterion (Li et al., "Pruning Filters for Efficient
    ConvNets", ICLR 2017). The bias is not masked: a pruned unit outputs
    ``activation(bias)``, a constant, which :func:`prune.shrink` folds into the
    next layer when it removes the unit.

    Args:
        keep_one: Keep at least one unit of each weight (tfmot's rule for entries).
    """

    keep_one: bool = False

    def __post_init__(self) -> None:
        _check_keep_one(self.keep_one)

    def check(self, shape: tuple[int, ...], where: str = "weight") -> None:
        if len(shape) < 1:
            raise ValueError(f"Channel() needs a weight with an output axis, {where} is a scalar")

    def units(self, scores: np.ndarray, previous: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        out = scores.shape[-1]
        return scores.reshape(-1, out).sum(axis=0), previous.reshape(-1, out).any(axis=0)

    def expand(self, unit_keep: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        return np.broadcast_to(unit_keep, shape).copy()


_PATTERNS: dict[str, type] = {c.__name__: c for c in (Unstructured, Block, NByM, Channel)}


def register_pattern(cls: type) -> type:
    """Register a :class:`Pattern` subclass so configs naming it load (usable as a decorator)."""
    if not (isinstance(cls, type) and issubclass(cls, Pattern)):
        raise ValueError(f"cls must be a prune.core.patterns.Pattern subclass, got {cls!r}")
    _PATTERNS[cls.__name__] = cls
    return cls


def patterns() -> list[str]:
    """Names of the registered patterns."""
    return sorted(_PATTERNS)


def serialize_pattern(pattern: Pattern) -> dict[str, Any]:
    """``{"class_name": ..., "config": ...}``, Keras's form; :func:`as_pattern` reads it back."""
    config = pattern.get_config()
    return {"class_name": type(pattern).__name__, "config": {k: list(v) if isinstance(v, tuple) else v for k, v in config.items()}}


def as_pattern(value: Any) -> Pattern:
    """A :class:`Pattern` from a pattern, ``None`` (unstructured) or a serialized config.

    Raises:
        ValueError: naming ``pattern`` and the value, listing the registered patterns.
    """
    if value is None:
        return Unstructured()
    if isinstance(value, Pattern):
        return value
    if isinstance(value, dict) and set(value) == {"class_name", "config"}:
        cls = _PATTERNS.get(value["class_name"])
        if cls is None:
            raise ValueError(f"unknown pattern {value['class_name']!r}; valid patterns: {patterns()}")
        config = dict(value["config"])
        if "block_size" in config:
            config["block_size"] = tuple(config["block_size"])
        return cls.from_config(config)
    raise ValueError(
        f"pattern must be a prune.core.patterns.Pattern (one of {patterns()}) or its serialized config, got {value!r}"
    )


def pattern_from_args(
    pattern: Any = None,
    block_size: Any = (1, 1),
    block_pooling_type: str = "AVG",
    sparsity_m_by_n: Any = None,
) -> Pattern:
    """The pattern named by ``pattern=`` or by tfmot's ``block_size``/``block_pooling_type``/``sparsity_m_by_n``.

    ``block_size=(1, 1)`` is unstructured (tfmot's default); any other size is
    :class:`Block`; ``sparsity_m_by_n=(m, n)`` is :class:`NByM`.

    Raises:
        ValueError: naming the argument: a bad value, or ``pattern`` together
            with a tfmot argument, or ``block_size`` together with ``sparsity_m_by_n``.
    """
    if block_pooling_type not in POOLINGS:
        raise ValueError(f"block_pooling_type must be 'AVG' or 'MAX', got {block_pooling_type!r}")
    try:
        size = tuple(block_size)
    except TypeError:
        raise ValueError(f"block_size must be two positive integers (r, c), got {block_size!r}") from None
    blocked = size != (1, 1)
    if pattern is not None:
        if blocked or sparsity_m_by_n is not None:
            raise ValueError(
                f"give the pattern once: pattern={pattern!r} together with "
                f"block_size={block_size!r}/sparsity_m_by_n={sparsity_m_by_n!r}; drop the tfmot arguments"
            )
        return as_pattern(pattern)
    if sparsity_m_by_n is not None:
        if blocked:
            raise ValueError(
                f"sparsity_m_by_n={sparsity_m_by_n!r} cannot be combined with block_size={block_size!r}; choose one"
            )
        try:
            pair = tuple(sparsity_m_by_n)
        except TypeError:
            raise ValueError(f"sparsity_m_by_n must be two integers (m, n), got {sparsity_m_by_n!r}") from None
        if len(pair) != 2:
            raise ValueError(f"sparsity_m_by_n must be two integers (m, n), got {sparsity_m_by_n!r}")
        return NByM(*pair)
    if blocked:
        return Block(size, block_pooling_type)  # type: ignore[arg-type]
    Block(size, block_pooling_type)  # validates (1, 1)-like input such as (1, 1.5)
    return Unstructured()
