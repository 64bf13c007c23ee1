"""The runner's registries and its method axis: validation, the grid, real runs of each method.

Config checks run no TensorFlow; the real runs train a 16-unit MLP on digits for one epoch.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from experiments import axes
from experiments.config import (
    ConfigError,
    DatasetConfig,
    ImplementationConfig,
    MethodConfig,
    ModelConfig,
    RunConfig,
    ScheduleConfig,
    TrainingConfig,
    canonical_json,
    from_dict,
    load_sweep,
    parse_sweep,
    to_dict,
)
from experiments.grid import expand

REPO = Path(__file__).resolve().parents[2]
BASE = dict(name="t", implementations=["dense", "masked"], sparsities=[0.5], models=["lenet300"], datasets=["digits"])


def error_of(**changes) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        expand(parse_sweep({**BASE, **changes}))
    return info.value


# -- validation ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "methods, path, message",
    [
        (["rigel"], "methods[0].name", "unknown method 'rigel'; did you mean 'rigl'? (valid: gmp, one_shot, snip, granet, mest, rigl, set, static, imp)"),
        ([{"name": "rigl", "drop_fraktion": 0.5}], "methods[0].drop_fraktion", "unknown key for method 'rigl'; did you mean 'drop_fraction'? (valid keys: name, update_every, drop_fraction, end, decay, drop, gradient_batch, sparsities)"),
        ([{"name": "set", "drop_fraction": 1.5}], "methods[0].drop_fraction", "must be in (0, 1], got 1.5"),
        ([{"name": "set", "update_every": 0}], "methods[0].update_every", "must be >= 1, got 0"),
        ([{"name": "set", "update_every": 2.5}], "methods[0].update_every", "must be an integer"),
        ([{"name": "rigl", "end": 0}], "methods[0].end", "must be a fraction of training in (0, 1], got 0"),
        ([{"name": "rigl", "decay": "linear"}], "methods[0].decay", "unknown decay 'linear' (valid: constant, cosine)"),
        ([{"name": "static", "drop_fraction": 0.3}], "methods[0].drop_fraction", "unknown key for method 'static' (valid keys: name, sparsities)"),
        ([{"name": "imp", "rate": 1.0}], "methods[0].rate", "must be a number in (0, 1), got 1.0"),
        ([{"name": "imp", "controls": ["reinit", "reinit"]}], "methods[0].controls", "must be distinct names from ['reinit', 'random'], got ['reinit', 'reinit']"),
        ([{"name": "imp", "controls": ["shuffle"]}], "methods[0].controls", "must be distinct names from ['reinit', 'random'], got ['shuffle']"),
        ([{"name": "imp", "stops": [0.4, 0.2]}], "methods[0].stops", "must be strictly increasing, got [0.4, 0.2]"),
        ([{"name": "imp", "stops": [0.2, 0.6]}], "method.stops[1]", "is 0.6, not below the run's sparsity 0.5"),
        ([{"name": "imp", "sparsities": [1.0]}], "methods[0].sparsities[0]", "must be < 1.0, got 1.0"),
        ([{"name": "one_shot", "at": 2.0}], "method.at", "is 2 epochs but training has 2 epochs"),
        ([{"rate": 0.2}], "methods[0].name", "is required"),
        ([], "methods", "is empty"),
    ],
)
def test_method_parameters_are_validated_naming_the_field_and_the_closest_key(methods, path, message):
    e = error_of(methods=methods)
    assert e.path == path, str(e)
    assert e.message.startswith(message), e.message


@pytest.mark.parametrize(
    "changes, path, message",
    [
        ({"implementations": ["tfmot"], "methods": ["set"]}, "method", "method 'set' does not run on implementation 'tfmot': sparse training (prune.training.dst) moves the masks of masked and SparseDense layers; tfmot has none (it runs on 'masked', 'sparse_tensor')"),
        ({"implementations": ["sparse_tensor"], "methods": ["imp"]}, "method", "method 'imp' does not run on implementation 'sparse_tensor': it prunes, rewinds and retrains masked layers"),
        ({"implementations": ["tfmot"], "methods": ["snip"]}, "method", "method 'snip' does not run on implementation 'tfmot': SNIP scores need gradients"),
        ({"methods": ["set"], "criteria": ["snip"]}, "criterion", "method 'set' chooses its own weights; leave criterion at 'magnitude'"),
        ({"methods": ["rigl"], "distributions": ["global"]}, "distribution", "method 'rigl' starts from a random mask per layer: 'layer' (uniform) or 'erk', not 'global'"),
        ({"methods": ["static"], "patterns": ["nm"]}, "pattern", "method 'static' moves single weights (prune.training.dst); it needs 'unstructured'"),
        ({"methods": ["imp"], "distributions": ["erk"]}, "distribution", "method 'imp' prunes by magnitude per 'layer' or 'global', not 'erk'"),
        ({"methods": ["snip"], "criteria": ["random"]}, "criterion", "method 'snip' scores by SNIP itself"),
    ],
)
def test_methods_an_implementation_or_run_cannot_take_are_refused_before_running_saying_why(changes, path, message):
    e = error_of(**changes)
    assert e.path == path, str(e)
    assert e.message.startswith(message), e.message
    assert "(grid cell " in e.message and f"methods={changes['methods'][0]!r}" in e.message


def _run(method: MethodConfig = MethodConfig(), **kw) -> RunConfig:
    base = dict(
        implementation=ImplementationConfig("masked"),
        dataset=DatasetConfig("digits"),
        model=ModelConfig("mlp", (16,)),
        seed=0,
        training=TrainingConfig(epochs=1, learning_rate=0.01),
        sparsity=0.8,
        method=method,
    )
    return RunConfig(**{**base, **kw})


def test_gmp_needs_a_schedule_and_the_other_methods_take_none():
    with pytest.raises(ConfigError, match=r"^schedule: implementation 'masked' needs a schedule \(method 'gmp'\)"):
        _run()
    with pytest.raises(ConfigError, match=r"^schedule: method 'set' decides its masks itself and takes no schedule"):
        _run(MethodConfig("set"), schedule=ScheduleConfig())
    with pytest.raises(ConfigError, match=r"^method: dense runs train no mask, so they take no method, got 'rigl'"):
        _run(MethodConfig("rigl"), implementation=ImplementationConfig("dense"), sparsity=0.0)
    with pytest.raises(ConfigError, match=r"^method.sparsities: belongs in a sweep's methods entry"):
        _run(MethodConfig("set", sparsities=(0.5,)))
    assert _run(MethodConfig("one_shot", axes.OneShotParams(at=0.5))).schedule_used() == ScheduleConfig("one_shot", begin=0.5)
    assert _run(MethodConfig("snip")).schedule_used() == ScheduleConfig("one_shot", begin=0.0)
    assert _run(MethodConfig("snip")).criterion_used == "snip" and _run(MethodConfig("set")).schedule_used() is None
    # the grid gives the schedules axis to gmp only
    runs = expand(parse_sweep({**BASE, "methods": ["gmp", "set"], "schedules": [{"end": 1}, {"kind": "constant"}]}))
    cells = sorted((r.implementation.name, r.method.name, r.schedule.kind if r.schedule else None) for r in runs)
    assert cells == [("dense", "gmp", None), ("masked", "gmp", "constant"), ("masked", "gmp", "polynomial"), ("masked", "set", None)]


def test_a_method_with_its_own_sparsities_runs_at_those_only():
    runs = expand(load_sweep(REPO / "experiments" / "configs" / "methods.toml"))
    by = {}
    for r in runs:
        by.setdefault(r.method.name, set()).add((r.sparsity, r.seed))
    assert by["imp"] == {(0.98, s) for s in (0, 1, 2)}
    for name in ("set", "rigl", "static"):
        assert by[name] == {(s, seed) for s in (0.8, 0.9, 0.95, 0.98) for seed in (0, 1, 2)}
    assert len(runs) == 3 * (1 + 4 * 4 + 1)
    imp = next(r for r in runs if r.method.name == "imp")
    assert imp.method.params == axes.ImpParams(0.2, 0, ("reinit", "random"), (0.8, 0.9, 0.95)) and imp.method.sparsities == ()
    assert {r.training for r in runs} == {TrainingConfig(epochs=5)}  # the same training for every method


def test_default_method_keeps_every_hash_and_a_method_round_trips_flat():
    gmp = _run(schedule=ScheduleConfig())
    assert "method" not in json.loads(canonical_json(gmp))
    assert dataclasses.replace(gmp, method=MethodConfig("gmp", axes.NoParams())).run_id == gmp.run_id
    rigl = _run(MethodConfig("rigl", axes.RiglParams(update_every=50)))
    assert json.loads(canonical_json(rigl))["method"] == {"name": "rigl", "update_every": 50}
    imp = _run(MethodConfig("imp", axes.ImpParams(stops=(0.5,))))
    assert to_dict(imp)["method"] == {"name": "imp", "rate": 0.2, "rewind_step": 0, "controls": ["reinit", "random"], "stops": [0.5], "sparsities": []}
    for run in (gmp, rigl, imp, _run(MethodConfig("static")), _run(MethodConfig("one_shot", axes.OneShotParams(0.5)))):
        assert from_dict(RunConfig, json.loads(json.dumps(to_dict(run)))) == run
        assert from_dict(RunConfig, json.loads(canonical_json(run))) == run
    assert len({r.run_id for r in (gmp, rigl, imp)}) == 3
    # the controls' order changes nothing (each is seeded from its name), so not the hash either
    swapped = _run(MethodConfig("imp", axes.ImpParams(stops=(0.5,), controls=("random", "reinit"))))
    assert swapped.method.params.controls == ("reinit", "random") and swapped.run_id == imp.run_id
    assert _run(MethodConfig("imp", axes.ImpParams(controls=("random",)))).method.params.controls == ("random",)


# -- the registries ------------------------------------------------------------------------------------------


def _tiny(config):
    rng = np.random.default_rng(config.split_seed)
    x = rng.random((40, 4, 4, 1), dtype=np.float32)
    y = (x.sum(axis=(1, 2, 3)) > 8).astype(np.int32)
    return x[:30], y[:30], x[30:], y[30:], 2


def test_a_new_dataset_is_one_registration():
    from experiments.data import load

    with pytest.raises(ConfigError, match=r"^name: unknown dataset 'tiny'"):
        DatasetConfig("tiny")
    axes.DATASETS.register(axes.Dataset("tiny", load=_tiny))
    try:
        data = load(DatasetConfig("tiny", split_seed=3))
        assert data.x_train.shape == (30, 4, 4, 1) and data.n_classes == 2 and data.y_test.dtype == np.int32
        with pytest.raises(ValueError, match="registered already"):
            axes.DATASETS.register(axes.Dataset("tiny", load=_tiny))
    finally:
        axes.DATASETS.unregister("tiny")
        load.cache_clear()


def test_every_schedule_kind_maps_to_prune_and_tfmot_and_an_unknown_one_is_refused():
    run = _run(schedule=ScheduleConfig("constant", begin=0.5, end=1.0, frequency=3))
    assert axes.schedule_args(run, 10) == ("ConstantSparsity", dict(target_sparsity=0.8, begin_step=5, end_step=10, frequency=3))
    kinds = axes.SCHEDULE_KINDS
    assert kinds.get("constant").tfmot(*axes.schedule_args(run, 10)) == (
        "ConstantSparsity", dict(target_sparsity=0.8, begin_step=6, end_step=11, frequency=3))
    one = _run(MethodConfig("one_shot", axes.OneShotParams(at=0.3)))
    assert axes.schedule_args(one, 10) == ("OneShot", dict(sparsity=0.8, step=3))
    assert kinds.get("one_shot").tfmot(*axes.schedule_args(one, 10)) == (
        "ConstantSparsity", dict(target_sparsity=0.8, begin_step=4, end_step=4, frequency=1))
    with pytest.raises(ValueError, match=r"method 'set'\) has no schedule"):
        axes.schedule_args(_run(MethodConfig("set")), 10)
    with pytest.raises(ConfigError, match=r"unknown schedule 'cosine' \(valid: constant, polynomial, one_shot\)"):
        kinds.get("cosine")


def test_run_one_does_not_import_the_tfmot_baseline_and_neither_imports_keras_3():
    code = (
        "import sys, experiments.run_one, experiments.__main__, experiments.train\n"
        "assert 'experiments.tfmot_baseline' not in sys.modules\n"
        "import experiments.tfmot_baseline\n"
        # prune's engine (registries, prune.training.imp) imports no TensorFlow and no Keras; the runner reads it
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('keras', 'tensorflow', 'tf_keras'))\n"
        "assert heavy == [], heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


# -- real runs -----------------------------------------------------------------------------------------------


def _train(run: RunConfig, run_dir: Path) -> dict:
    from experiments.data import load
    from experiments.implementations import train_keras3

    run_dir.mkdir(parents=True, exist_ok=True)
    return train_keras3(run, load(run.dataset), run_dir, lambda line: None)


@pytest.mark.parametrize("impl", ["masked", "sparse_tensor"])
def test_set_and_rigl_runs_move_masks_at_exact_counts_and_log_every_update(tmp_path, impl):
    spe = 23  # 1437 digits training examples, batch 64
    for name, params in (("set", axes.SetParams(update_every=4)), ("rigl", axes.RiglParams(update_every=4))):
        run = _run(MethodConfig(name, params), implementation=ImplementationConfig(impl))
        out = _train(run, tmp_path / name)
        log = pd.read_csv(tmp_path / name / "mask_updates.csv")
        assert list(log.columns) == ["step", "key", "live", "dropped", "grown", "changed_fraction"]
        end = spe if name == "set" else round(0.75 * spe)
        assert sorted(set(log["step"])) == list(range(4, end, 4))
        assert set(log["key"]) == {"dense_0/kernel", "dense_1/kernel"}
        live = {"dense_0/kernel": 1024 - round(0.8 * 1024), "dense_1/kernel": 160 - round(0.8 * 160)}
        assert (log["live"] == log["key"].map(live)).all()  # exact at every update
        assert (log["dropped"] == log["grown"]).all() and log["dropped"].sum() > 0
        np.testing.assert_array_equal(log["changed_fraction"], log["dropped"] / log["live"])
        assert (log["changed_fraction"] <= 0.3).all()
        if name == "rigl":  # cosine decay: the last update drops fewer than the first
            first, last = (log[log["key"] == "dense_0/kernel"]["dropped"].iloc[i] for i in (0, -1))
            assert last < first
        for key, kernel in out["kernels"].items():
            assert np.count_nonzero(kernel) <= live[f"{key}/kernel"]


def test_mest_and_granet_run_from_a_sweep_config_with_their_own_parameters(tmp_path):
    """Registered in prune.algorithms only: the runner offers them, validates their own parameters and runs them."""
    sweep = {**BASE, "implementations": ["masked"], "sparsities": [0.8],
             "methods": [{"name": "mest", "update_every": 4, "lam": 0.5},
                         {"name": "granet", "update_every": 4, "initial_sparsity": 0.5, "scope": "layer"}]}
    runs = {r.method.name: r for r in expand(parse_sweep(sweep)) if r.implementation.name == "masked"}
    assert runs["mest"].method.params == axes.MestParams(update_every=4, lam=0.5)
    assert runs["granet"].method.params.drop_fraction == 0.5 and runs["granet"].method.params.decay == "cosine"
    assert json.loads(canonical_json(runs["mest"]))["method"] == {"name": "mest", "update_every": 4, "lam": 0.5}
    spe = 23  # 1437 digits training examples, batch 64
    for name in ("mest", "granet"):
        run = dataclasses.replace(runs[name], model=ModelConfig("mlp", (16,)), training=TrainingConfig(epochs=1))
        _train(run, tmp_path / name)
        log = pd.read_csv(tmp_path / name / "mask_updates.csv")
        assert sorted(set(log["step"])) == list(range(4, spe, 4)) and log["dropped"].sum() > 0
        live = log.pivot(index="step", columns="key", values="live")
        if name == "mest":  # an exchange: every weight keeps the live count sparse_init gave it
            assert (live.nunique() == 1).all() and live.iloc[0]["dense_0/kernel"] == 1024 - round(0.8 * 1024)
        else:  # from 50% to 80% along the cubic schedule, ending at 110/160 of the training (layer scope: exact)
            assert (live.diff().dropna() <= 0).all().all()
            assert live.iloc[-1]["dense_0/kernel"] == 1024 - round(0.8 * 1024)
            assert live.iloc[0]["dense_0/kernel"] > 1024 - round(0.8 * 1024)
    for bad, path, message in [
        ({"name": "mest", "lam": -1.0}, "lam", "must be a number in [0, inf), got -1.0"),
        ({"name": "granet", "initial_sparsity": 0.9}, "initial_sparsity", "must be a number in [0, final_sparsity=0.8]"),
        ({"name": "granet", "scope": "erk"}, "scope", "must be one of ['global', 'layer'], got 'erk'"),
    ]:
        with pytest.raises(ConfigError) as err:
            expand(parse_sweep({**sweep, "methods": [bad]}))
        assert err.value.path.endswith(path) and message in err.value.message, (err.value.path, err.value.message)


def test_static_training_keeps_the_random_mask_of_its_seed(tmp_path):
    import keras

    import prune
    from experiments.data import load
    from experiments.models import seeded_model

    run = _run(MethodConfig("static"), distribution="erk")
    out = _train(run, tmp_path / "static")
    plain, _ = seeded_model(run, load(run.dataset), keras)
    model = prune.prune_low_magnitude(plain)
    prune.sparse_init(model, 0.8, distribution="erk", seed=0)
    masks = [layer.get_masks()["kernel"] for layer in prune.prunable_layers(model)]
    for mask, kernel in zip(masks, out["kernels"].values()):
        assert np.all(kernel[~mask] == 0.0) and np.all(kernel[mask] != 0.0)
    assert sum(int((~m).sum()) for m in masks) == round(0.8 * (1024 + 160))
    assert pd.read_csv(tmp_path / "static" / "mask_updates.csv").empty


def test_snip_is_one_shot_at_step_0_with_the_snip_criterion(tmp_path):
    snip = _train(_run(MethodConfig("snip")), tmp_path / "a")
    same = _train(_run(MethodConfig("one_shot"), criterion="snip"), tmp_path / "b")
    magnitude = _train(_run(MethodConfig("one_shot")), tmp_path / "c")
    for key in snip["kernels"]:
        np.testing.assert_array_equal(snip["kernels"][key], same["kernels"][key])
    assert any((snip["kernels"][k] == 0).tolist() != (magnitude["kernels"][k] == 0).tolist() for k in snip["kernels"])


def test_imp_runs_through_the_runner_and_writes_its_levels(tmp_path):
    from experiments.run_one import execute, init_process

    init_process("keras3", 1)
    run = _run(MethodConfig("imp", axes.ImpParams(rate=0.5, stops=(0.5,))), sparsity=0.75)
    record = execute(run, tmp_path / run.run_id, {"sweep": "t"})
    assert record["row"]["status"] == "ok", record["row"]["error"]
    assert record["row"]["method"] == "imp" and abs(record["row"]["sparsity"] - 0.75) < 0.01
    levels = pd.read_csv(tmp_path / run.run_id / "levels.csv")
    ticket = levels[levels["variant"] == "ticket"]
    np.testing.assert_allclose(ticket["sparsity"].round(2), [0.0, 0.5, 0.75])
    assert set(levels["variant"]) == {"ticket", "reinit", "random"}


# -- the methods figures, on a tiny results folder -----------------------------------------------------------

LEVELS = """level,variant,sparsity,remaining,test_accuracy,test_loss,train_accuracy,train_loss,status
0,ticket,0.0,1.0,0.90,0.3,0.95,0.2,ok
1,ticket,0.5,0.5,0.91,0.3,0.95,0.2,ok
1,reinit,0.5,0.5,0.85,0.4,0.9,0.3,ok
1,random,0.5,0.5,0.80,0.5,0.85,0.4,ok
2,ticket,0.7502,0.2498,0.88,0.3,0.95,0.2,ok
2,reinit,0.7502,0.2498,0.70,0.4,0.9,0.3,ok
2,random,0.7502,0.2498,0.60,0.5,0.85,0.4,ok
3,ticket,0.9,0.1,0.75,0.3,0.95,0.2,ok
3,reinit,0.9,0.1,0.50,0.4,0.9,0.3,ok
3,random,0.9,0.1,0.40,0.5,0.85,0.4,ok
"""


def test_methods_figures_from_a_tiny_sweep_are_byte_identical(tmp_path):
    from experiments import figures
    from experiments.plots.methods import imp_ticket_points, plot_imp_levels, plot_mask_changes
    from experiments.run_one import execute, init_process
    from experiments.store import Store

    sweep = parse_sweep({
        "name": "m", "implementations": ["dense", "masked"], "sparsities": [0.75], "models": [{"name": "mlp", "widths": [16]}],
        "datasets": ["digits"], "methods": ["gmp", "static", {"name": "set", "update_every": 6}, {"name": "rigl", "update_every": 6}],
        "training": {"epochs": 1, "learning_rate": 0.01},
    })
    root = tmp_path / "m"
    init_process("keras3", 1)
    store = Store(root)
    store.open()
    for run in expand(sweep):
        record = execute(run, root / "runs" / run.run_id, {"sweep": "m"})
        assert record["row"]["status"] == "ok", record["row"]["error"]
        store.add(record["row"], record["curves"])
    static = next(r for r in store.rows.values() if r["method"] == "static")
    imp_id = "masked-00000000000000aa"
    store.add({**static, "run_id": imp_id, "method": "imp", "target_sparsity": 0.9}, [])
    (root / "runs" / imp_id).mkdir()
    (root / "runs" / imp_id / "levels.csv").write_text(LEVELS)

    first = figures.draw_figures("m", tmp_path / "a", results_root=tmp_path)
    second = figures.draw_figures("m", tmp_path / "b", results_root=tmp_path)
    names = [p.name for p in first]
    assert names == [f"{n}.{ext}" for n in ("accuracy_by_method", "imp_levels", "mask_changes") for ext in ("pdf", "png")]
    assert [p.read_bytes() for p in first] == [p.read_bytes() for p in second]

    runs, _ = figures.load_sweep("m", tmp_path)
    levels = pd.read_csv(root / "runs" / imp_id / "levels.csv").assign(run_id=imp_id)
    points = imp_ticket_points(runs, levels)
    assert points[["target", "test_accuracy", "level"]].values.tolist() == [[0.75, 0.88, 2]]  # 0.7502 is within 0.005
    with pytest.raises(ValueError, match=r"has no ticket level at sparsity 0.75 \(closest 0.9000\); give the method stops"):
        imp_ticket_points(runs, levels[levels["level"] != 2])
    fig = plot_imp_levels(levels)
    ticket = fig.axes[0].lines[0]
    np.testing.assert_allclose(ticket.get_xdata(), [100, 50, 24.98, 10])
    np.testing.assert_allclose(ticket.get_ydata(), [90, 91, 88, 75])
    np.testing.assert_allclose(fig.axes[0].lines[1].get_ydata(), [90, 85, 70, 50])  # reinit starts at the dense level
    set_id = next(r["run_id"] for r in store.rows.values() if r["method"] == "set")
    log = pd.read_csv(root / "runs" / set_id / "mask_updates.csv")
    expected = (log.groupby("step")["dropped"].sum() / log.groupby("step")["live"].sum() * 100).to_numpy()
    updates = log.assign(run_id=set_id, method="set", target=0.75)
    np.testing.assert_allclose(plot_mask_changes(updates).axes[0].lines[0].get_ydata(), expected)


def test_a_sweep_gets_the_method_figures_when_methods_vary_or_its_one_method_is_not_gmp():
    """An IMP-only sweep (fmnist_lenet300_imp) draws its levels, not the single-method GMP figures and layer speed-ups."""
    from experiments.plots.methods import varies_method

    def runs(*methods):
        return pd.DataFrame({"implementation": ["dense", *["masked"] * len(methods)], "method": ["", *methods]})

    assert varies_method(runs("gmp", "set"))
    assert varies_method(runs("imp", "imp"))
    assert not varies_method(runs("gmp", "gmp"))
    assert not varies_method(pd.DataFrame({"implementation": ["masked"]}))  # a table from before the axis
