"""Which ``EinsumDense`` equations are a matrix product in order, and the matrix their kernel is then.

An equation in which the input's last ``k`` axes are contracted with the kernel's first ``k`` axes, and the
output is the input's other axes followed by the kernel's other axes, in order (``abc,cde->abde``, the query,
key and value projections of ``MultiHeadAttention``; ``abcd,cde->abe``, its output projection;
``...b,bc->...c``), computes ``x.reshape(-1, d_in) @ W`` with ``W`` the kernel read row-major as
``[d_in, d_out] = [prod(contracted), prod(free)]``. That matrix is the one home of an ``EinsumDense`` kernel's
two-dimensional view: :class:`prune.layers.SparseEinsumDense` stores it, patterns select on it (``NByM``'s groups
run along its ``d_in``, as for a ``Dense`` kernel; :meth:`prune.layers.PrunableLayer.pattern_shape`), and
:func:`prune.oneshot` calibrates on it. Pure Python: no TensorFlow or Keras import.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Any

__all__ = ["FAMILY", "EinsumMatrixForm", "einsum_matrix_form", "matrix_shape"]

FAMILY = (
    "the input's last k axes contracted with the kernel's first k axes, the output the input's other axes followed "
    "by the kernel's other axes (e.g. 'abc,cde->abde', 'abcd,cde->abe', '...b,bc->...c')"
)


@dataclass(frozen=True)
class EinsumMatrixForm:
    """An ``EinsumDense`` equation read as a matrix product (:func:`einsum_matrix_form`).

    Attributes:
        inputs: The input's axis letters (without the ellipsis).
        kernel: The kernel's axis letters.
        output: The output's axis letters (without the ellipsis).
        contracted: ``k``: the input's last ``k`` axes meet the kernel's first ``k``.
        ellipsis: Whether the equation starts its input and output with ``...``.
    """

    inputs: str
    kernel: str
    output: str
    contracted: int
    ellipsis: bool

    @property
    def free(self) -> int:
        """The number of the kernel's axes that reach the output."""
        return len(self.kernel) - self.contracted


def einsum_matrix_form(equation: Any) -> EinsumMatrixForm | None:
    """How ``equation`` contracts its input with its kernel, or ``None`` when it is not a matrix product in order.

    Args:
        equation: An ``EinsumDense`` equation such as ``"abc,cde->abde"`` (spaces ignored).

    Returns:
        The :class:`EinsumMatrixForm` of an equation of the family the module
        docstring gives; ``None`` for any other (a transposed kernel
        ``abc,dc->abd``, an input axis shared with the kernel's output side, a
        trailing ellipsis, a malformed string).
    """
    if not isinstance(equation, str):
        return None
    eq = equation.replace(" ", "")
    ellipsis = eq.startswith("...")
    if ellipsis:
        eq = eq[3:]
        if "->..." not in eq:
            return None
        eq = eq.replace("->...", "->", 1)
    try:
        lhs, out = eq.split("->")
        x, k = lhs.split(",")
    except ValueError:
        return None
    specs = (x, k, out)
    if any(not s.isalpha() or not s.isascii() or len(set(s)) != len(s) for s in specs):
        return None
    # k contracted axes: the input ends with the kernel's first k letters, and the output is the rest in order
    found = [c for c in range(1, min(len(x), len(k)) + 1) if x[len(x) - c :] == k[:c] and x[: len(x) - c] + k[c:] == out]
    if not found:
        return None
    c = found[0]
    if set(x[: len(x) - c]) & set(k) or not k[c:]:
        return None
    if not ellipsis and len(x) == c:
        return None  # no batch axis left to the input
    return EinsumMatrixForm(inputs=x, kernel=k, output=out, contracted=c, ellipsis=ellipsis)


def matrix_shape(equation: Any, kernel_shape: tuple[int, ...]) -> tuple[int, int] | None:
    """``(d_in, d_out)`` of the kernel of ``equation`` read as a matrix, or ``None`` outside the family.

    Args:
        equation: An ``EinsumDense`` equation.
        kernel_shape: Its kernel's shape.

    Returns:
        ``(prod(kernel_shape[:k]), prod(kernel_shape[k:]))`` for ``k`` contracted axes; ``None`` when
        :func:`einsum_matrix_form` refuses the equation or the kernel's rank does not fit it.
    """
    form = einsum_matrix_form(equation)
    shape = tuple(int(d) for d in kernel_shape)
    if form is None or len(shape) != len(form.kernel):
        return None
    return prod(shape[: form.contracted]), prod(shape[form.contracted :])
