"""The runner's pattern, criterion and distribution axes: real training, old tables, the figure.

Config parsing and validation of the axes are in ``tests/experiments/test_config.py``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from experiments.config import (
    DatasetConfig,
    ImplementationConfig,
    ModelConfig,
    PatternConfig,
    RunConfig,
    ScheduleConfig,
    TrainingConfig,
)
from experiments.store import RUN_COLUMNS, Store

REPO = Path(__file__).resolve().parents[2]


def _run(impl: str, pattern: PatternConfig, criterion: str, sparsity: float) -> RunConfig:
    return RunConfig(
        implementation=ImplementationConfig(impl),
        dataset=DatasetConfig("digits"),
        model=ModelConfig("mlp", (16,)),
        seed=0,
        training=TrainingConfig(epochs=3, batch_size=64, learning_rate=0.01),
        sparsity=sparsity,
        schedule=ScheduleConfig("one_shot", begin=0.0),
        pattern=pattern,
        criterion=criterion,
    )


def _step0_zeros(run: RunConfig, data, criterion: str) -> list[np.ndarray]:
    """Where the engine puts zeros at step 0 for ``run`` under ``criterion``, scored on the runner's fixed batch."""
    import dataclasses

    import keras

    import prune
    from experiments.implementations import gradient_batch, library_schedule, pruning_kwargs
    from experiments.models import seeded_model
    from experiments.steps import steps_per_epoch

    run = dataclasses.replace(run, implementation=ImplementationConfig("masked"), criterion=criterion)
    plain, _ = seeded_model(run, data, keras)
    spe = steps_per_epoch(len(data.x_train), run.training.batch_size)
    model = prune.prune_low_magnitude(plain, library_schedule(run, spe), **pruning_kwargs(run))
    model.compile(loss="sparse_categorical_crossentropy")
    batch = gradient_batch(dataclasses.replace(run, criterion="snip"), data)
    prune.update_masks(model, 0, gradients=prune.compute_gradients(model, *batch))
    return [np.asarray(layer.kernel.numpy()) == 0.0 for layer in prune.strip_pruning(model).layers if hasattr(layer, "kernel")]


@pytest.mark.parametrize(
    "impl, pattern, sparsity",
    [("masked", PatternConfig("nm"), 0.5), ("sparse_tensor", PatternConfig("block", size=(4, 4)), 0.75)],
)
def test_a_real_run_with_a_structured_pattern_and_snip(tmp_path, impl, pattern, sparsity):
    """Three epochs on digits, one-shot at step 0: the kernels keep exactly SNIP's masks on the fixed batch, in the pattern."""
    from experiments.data import load
    from experiments.implementations import gradient_batch, train_keras3

    run = _run(impl, pattern, "snip", sparsity)
    data = load(run.dataset)
    x, y = gradient_batch(run, data)
    np.testing.assert_array_equal(x, data.x_train[:64])
    np.testing.assert_array_equal(y, data.y_train[:64])
    assert gradient_batch(_run(impl, pattern, "magnitude", sparsity), data) is None
    snip, magnitude = _step0_zeros(run, data, "snip"), _step0_zeros(run, data, "magnitude")
    assert any((s != m).any() for s, m in zip(snip, magnitude))  # so the check below tells SNIP from magnitude

    out = train_keras3(run, data, tmp_path, lambda line: None)
    assert out["final"]["test_accuracy"] > 0.2  # it learns (chance is 0.1); 3 epochs of a 16-unit MLP are not more
    if impl == "sparse_tensor":  # matmul auto: the native kernels with this build's flags, or the fallback's reason
        from prune import native

        st = native.status()
        want = (f"native {st.vector}", st.flags) if st.available else (f"tensorflow (fallback: {st.reason})", "")
        assert (out["native_kernel"], out["native_flags"]) == want and want[0] and (want[1] or not st.available)
    else:
        assert "native_kernel" not in out
    kernels = list(out["kernels"].values())
    assert [k.shape for k in kernels] == [(64, 16), (16, 10)]
    for kernel, expected in zip(kernels, snip):
        np.testing.assert_array_equal(kernel == 0.0, expected)
        zero = kernel == 0.0
        if pattern.name == "nm":  # 2 zeros in every 4 consecutive inputs of each output unit
            assert (zero.reshape(zero.shape[0] // 4, 4, zero.shape[1]).sum(axis=1) == 2).all()
        else:  # whole 4x4 tiles (edge tiles 4x2), exactly round(0.75 * tiles) of them
            tiles = [zero[r : r + 4, c : c + 4] for r in range(0, zero.shape[0], 4) for c in range(0, zero.shape[1], 4)]
            assert all(t.all() or not t.any() for t in tiles)
            assert sum(t.all() for t in tiles) == round(0.75 * len(tiles))


def test_a_runs_csv_from_before_the_axes_is_read_with_their_defaults(tmp_path):
    """The committed paper table has no pattern/criterion/distribution columns; the store fills the defaults."""
    root = tmp_path / "paper"
    root.mkdir()
    lines = (REPO / "results" / "paper" / "runs.csv").read_text().splitlines(keepends=True)
    (root / "runs.csv").write_text("".join(lines[:4]))
    shutil.copy(REPO / "results" / "paper" / "curves.csv", root / "curves.csv")
    store = Store(root)
    rows = store.read()
    assert len(rows) == 3 and (root / "runs.csv").read_text() == "".join(lines[:4])  # read writes nothing
    for row in rows.values():
        expected = ("", "", "") if row["implementation"] == "dense" else ("unstructured", "magnitude", "layer")
        assert (row["pattern"], row["criterion"], row["distribution"]) == expected
        assert row["native_kernel"] == row["native_flags"] == ""  # not recorded then: unknown
    store.open()  # the runner's open rewrites it with today's header
    assert (root / "runs.csv").read_text().splitlines()[0].split(",") == RUN_COLUMNS
    assert Store(root).read() == rows


def test_the_axes_figure_is_one_file_pair_and_byte_identical(tmp_path):
    """A sweep over pattern and criterion draws accuracy_by_pattern only, the same bytes twice."""
    from experiments import figures

    rng = np.random.default_rng(0)
    rows, curves = [], []
    for seed in (0, 1):
        cells = [("dense", "", "", 0.0)] + [
            ("masked", p, c, s)
            for p, ss in (("unstructured", (0.5, 0.9)), ("2:4", (0.5,)), ("block4x4", (0.5, 0.9)))
            for c in ("magnitude", "snip", "random")
            for s in ss
        ]
        for i, (impl, pat, crit, s) in enumerate(cells):
            row = {c: "" for c in RUN_COLUMNS}
            run_id = f"{impl}-{seed}-{i:02d}"
            row.update(run_id=run_id, implementation=impl, dataset="mnist5k", model="lenet300", target_sparsity=s,
                       pattern=pat, criterion=crit, distribution="layer" if pat else "", seed=seed, status="ok",
                       test_accuracy=0.95 - 0.1 * s * (crit == "random") + rng.normal(0, 0.003), sparsity=s)
            rows.append(row)
            curves.append({"run_id": run_id, "epoch": 1, "metric": "test_accuracy", "value": row["test_accuracy"]})
    root = tmp_path / "results" / "axes"
    root.mkdir(parents=True)
    pd.DataFrame(rows, columns=RUN_COLUMNS).to_csv(root / "runs.csv", index=False)
    pd.DataFrame(curves).to_csv(root / "curves.csv", index=False)
    first = figures.draw_figures("axes", tmp_path / "a", tmp_path / "results")
    second = figures.draw_figures("axes", tmp_path / "b", tmp_path / "results")
    assert [p.name for p in first] == ["accuracy_by_pattern.pdf", "accuracy_by_pattern.png"]
    assert [p.read_bytes() for p in first] == [p.read_bytes() for p in second]


def test_a_runs_csv_from_before_the_kernel_columns_is_read_and_the_fallback_is_named(tmp_path):
    """The methods table has every axis but no native_kernel/native_flags: read with them empty; a fallback row is named."""
    from experiments.summary import kernel_note

    root = tmp_path / "methods"
    root.mkdir()
    lines = (REPO / "results" / "methods" / "runs.csv").read_text().splitlines(keepends=True)
    assert "native_kernel" not in lines[0]
    (root / "runs.csv").write_text("".join(lines[:3]))
    rows = Store(root).read()
    assert len(rows) == 2 and all(r["native_kernel"] == r["native_flags"] == "" for r in rows.values())
    frame = pd.DataFrame(list(rows.values()))
    assert kernel_note(frame) is None
    frame.loc[frame.index[0], "native_kernel"] = "tensorflow (fallback: PRUNE_NATIVE=0)"
    note = kernel_note(frame)
    assert note is not None and "1 of 2 run(s)" in note and "PRUNE_NATIVE=0" in note
