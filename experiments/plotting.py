"""Drawing functions shared by ``python -m experiments figures`` and the notebooks (re-exported from :mod:`experiments.plots`).

Each ``plot_*`` function draws one figure from a results table and returns the
:class:`matplotlib.figure.Figure` (created without pyplot, so nothing global is
touched). Every figure is drawn inside :func:`use_style` (the project style
file ``experiments/paper.mplstyle``: one paper column, ~3.3 in wide), and every
implementation keeps the same colour and marker everywhere
(:func:`style_for`, Okabe-Ito palette, colour-blind safe).

The table helpers (:func:`tidy_runs`, :func:`aggregate`, :func:`crossover`,
:func:`pareto_front`, :func:`layer_speedups`) are the same numbers the figures
show, so a notebook can check a claim against exactly what is drawn.

Sparsity axes use :func:`sparsity_axis`: positions are ``log10(1 / density)``,
labels are the sparsity in percent, so 90 %, 95 % and 98 % do not crowd into
the right edge and the ideal ``1 / density`` speed-up is a straight line.

The functions live in :mod:`experiments.plots`, one module per family of
figures; this module keeps the names notebooks and tests import.
"""

from __future__ import annotations

from experiments.plots import freezing, layer_speed, methods, paper, patterns, tradeoff
from experiments.plots.freezing import *  # noqa: F403
from experiments.plots.layer_speed import *  # noqa: F403
from experiments.plots.methods import *  # noqa: F403
from experiments.plots.paper import *  # noqa: F403
from experiments.plots.patterns import *  # noqa: F403
from experiments.plots.tradeoff import *  # noqa: F403
from experiments.plots.style import (
    IMPLEMENTATION_ORDER,
    OKABE_ITO,
    STYLE_PATH,
    aggregate,
    crossover,
    implementation_label,
    pareto_front,
    sparsity_axis,
    style_for,
    tidy_runs,
    use_style,
)

_STYLE = [
    "STYLE_PATH", "OKABE_ITO", "IMPLEMENTATION_ORDER", "use_style", "style_for", "implementation_label", "tidy_runs",
    "aggregate", "crossover", "pareto_front", "sparsity_axis",
]
__all__ = [*_STYLE, *paper.__all__, *layer_speed.__all__, *freezing.__all__, *patterns.__all__, *methods.__all__, *tradeoff.__all__]
