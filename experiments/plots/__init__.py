"""The figures, one module per family; :mod:`experiments.plotting` re-exports their public names.

* :mod:`~experiments.plots.style`: the style file, colours and markers, the runs-table helpers, the sparsity axis;
* :mod:`~experiments.plots.paper`: accuracy, step time, latency, FLOPs against sparsity, training curves;
* :mod:`~experiments.plots.layer_speed`: the layer benchmark's speed-ups;
* :mod:`~experiments.plots.freezing`: the partial-freezing experiment;
* :mod:`~experiments.plots.patterns`: the pattern x criterion sweep;
* :mod:`~experiments.plots.methods`: the methods sweep (GMP, SNIP, SET, RigL, IMP);
* :mod:`~experiments.plots.tradeoff`: accuracy against measured latency (`benchmarks/deployed_latency.py`).
"""
