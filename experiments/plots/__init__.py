"""The figures, one module per family, drawn by ``python -m experiments figures`` and the notebooks.

* :mod:`~experiments.plots.style`: the style file, colours and markers, the runs-table helpers, the sparsity axis;
* :mod:`~experiments.plots.paper`: accuracy, step time, latency, FLOPs against sparsity, training curves;
* :mod:`~experiments.plots.layer_speed`: the layer benchmark's speed-ups;
* :mod:`~experiments.plots.freezing_variants`: the partial-freezing experiment;
* :mod:`~experiments.plots.pruning_axes`: the pattern x criterion sweep;
* :mod:`~experiments.plots.methods`: the methods sweep (GMP, SNIP, SET, RigL, IMP);
* :mod:`~experiments.plots.tradeoff`: accuracy against measured latency (`benchmarks/deployed_latency.py`).

Import each name from its module (``from experiments.plots.paper import plot_accuracy_vs_sparsity``); this
package re-exports nothing.

Each ``plot_*`` function draws one figure from a results table and returns the
:class:`matplotlib.figure.Figure` (created without pyplot, so nothing global is
touched). Every figure is drawn inside :func:`~experiments.plots.style.use_style`
(the project style file ``experiments/paper.mplstyle``: one paper column, ~3.3 in
wide), and every implementation keeps the same colour and marker everywhere
(:func:`~experiments.plots.style.style_for`, Okabe-Ito palette, colour-blind safe).

The table helpers (``tidy_runs``, ``aggregate``, ``crossover``, ``pareto_front``
in :mod:`~experiments.plots.style`, ``layer_speedups`` in
:mod:`~experiments.plots.layer_speed`) are the same numbers the figures show, so
a notebook can check a claim against exactly what is drawn.

Sparsity axes use :func:`~experiments.plots.style.sparsity_axis`: positions are
``log10(1 / density)``, labels are the sparsity in percent, so 90 %, 95 % and
98 % do not crowd into the right edge and the ideal ``1 / density`` speed-up is
a straight line.
"""
