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

from experiments.plots.freezing import plot_partial_freezing
from experiments.plots.layer_speed import layer_speedups, plot_layer_speedup
from experiments.plots.methods import (
    IMP_VARIANTS,
    METHOD_ORDER,
    imp_ticket_points,
    plot_accuracy_by_method,
    plot_imp_levels,
    plot_mask_changes,
    varies_method,
)
from experiments.plots.paper import (
    plot_accuracy_curves,
    plot_accuracy_vs_flops,
    plot_accuracy_vs_sparsity,
    plot_latency_vs_sparsity,
    plot_step_time_vs_sparsity,
)
from experiments.plots.patterns import AXIS_DEFAULTS, CRITERION_ORDER, plot_accuracy_by_pattern, varies_pruning_axes
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

__all__ = [
    "STYLE_PATH",
    "OKABE_ITO",
    "IMPLEMENTATION_ORDER",
    "use_style",
    "style_for",
    "implementation_label",
    "tidy_runs",
    "aggregate",
    "crossover",
    "pareto_front",
    "layer_speedups",
    "sparsity_axis",
    "plot_accuracy_vs_sparsity",
    "plot_step_time_vs_sparsity",
    "plot_latency_vs_sparsity",
    "plot_accuracy_vs_flops",
    "plot_accuracy_curves",
    "plot_layer_speedup",
    "plot_partial_freezing",
    "AXIS_DEFAULTS",
    "CRITERION_ORDER",
    "varies_pruning_axes",
    "plot_accuracy_by_pattern",
    "METHOD_ORDER",
    "IMP_VARIANTS",
    "varies_method",
    "imp_ticket_points",
    "plot_accuracy_by_method",
    "plot_imp_levels",
    "plot_mask_changes",
]
