"""Expand a :class:`~experiments.config.SweepConfig` into its runs."""

from __future__ import annotations

import dataclasses
import itertools

from experiments import axes
from experiments.config import ConfigError, MethodConfig, PatternConfig, RunConfig, SweepConfig

__all__ = ["expand"]


def expand(sweep: SweepConfig) -> list[RunConfig]:
    """Every run of the sweep, in a fixed order, without duplicates.

    The grid is datasets x models x seeds x implementations x methods x
    schedules x patterns x criteria x distributions x sparsities. ``dense``
    ignores sparsity, method, schedule, pattern, criterion and distribution,
    so it appears once per (dataset, model, seed). Only methods that need a
    schedule (``gmp``) take the schedules axis; the others run once per
    remaining cell. A method entry with its own ``sparsities`` uses them
    instead of the sweep's. An ``nm`` pattern fixes the sparsity at m/n (the
    schedule only says when), so its runs get that sparsity whatever
    ``sparsities`` says, once. Runs with the same hash (e.g. a sparsity listed
    twice) are kept once.

    Raises:
        ConfigError: a cell is invalid (e.g. lenet5 on synthetic data, or a
            method an implementation cannot run), naming the axis values; or
            the grid is empty.
    """
    runs: dict[str, RunConfig] = {}
    for dataset, model, seed, impl in itertools.product(
        sweep.datasets, sweep.models, sweep.seeds, sweep.implementations
    ):
        if not axes.IMPLEMENTATIONS.get(impl.name).prunes:
            cells = [(0.0, None, PatternConfig(), "magnitude", "layer", MethodConfig())]
        else:
            cells = [
                (s if pat.fixed_sparsity is None else pat.fixed_sparsity, sch, pat, crit, dist, run_method)
                for method in sweep.methods
                for run_method in [dataclasses.replace(method, sparsities=())]
                for sch in (sweep.schedules if method.spec.schedule else (None,))
                for pat in sweep.patterns
                for crit in sweep.criteria
                for dist in sweep.distributions
                for s in (method.sparsities or sweep.sparsities)
            ]
        for sparsity, schedule, pattern, criterion, distribution, method in cells:
            try:
                run = RunConfig(
                    implementation=impl,
                    dataset=dataset,
                    model=model,
                    seed=seed,
                    training=sweep.training,
                    sparsity=sparsity,
                    schedule=schedule,
                    pattern=pattern,
                    criterion=criterion,
                    distribution=distribution,
                    method=method,
                    output_layer=sweep.output_layer if axes.IMPLEMENTATIONS.get(impl.name).prunes else "pruned",
                )
            except ConfigError as e:
                where = f"datasets={dataset.name!r}, models={model.label!r}, implementations={impl.label!r}"
                if axes.IMPLEMENTATIONS.get(impl.name).prunes:
                    where += f", patterns={pattern.label!r}, criteria={criterion!r}, distributions={distribution!r}"
                    if method != MethodConfig():
                        where += f", methods={method.name!r}"
                raise ConfigError(e.path, f"{e.message} (grid cell {where})") from None
            runs.setdefault(run.run_id, run)
    if not runs:
        raise ConfigError("", "the grid is empty")
    return list(runs.values())
