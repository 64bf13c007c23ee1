"""Schedules: exact numbers, validation, config round trips, agreement with tfmot."""

import json
import subprocess
import sys
import textwrap

import dataclasses
import inspect

import keras
import numpy as np
import pytest

import prune
from prune.core.schedules import as_schedule, schedule_from_config, serialize_schedule

CASES = [
    ("ConstantSparsity", dict(target_sparsity=0.5, begin_step=0)),
    ("ConstantSparsity", dict(target_sparsity=0.9, begin_step=7, end_step=53, frequency=5)),
    ("ConstantSparsity", dict(target_sparsity=0.3, begin_step=10, end_step=10, frequency=1)),
    ("PolynomialDecay", dict(initial_sparsity=0.0, final_sparsity=0.9, begin_step=0, end_step=100, frequency=10)),
    ("PolynomialDecay", dict(initial_sparsity=0.2, final_sparsity=0.95, begin_step=13, end_step=77, power=2, frequency=3)),
    ("PolynomialDecay", dict(initial_sparsity=0.5, final_sparsity=0.8, begin_step=5, end_step=6, power=1, frequency=1)),
]


def _last_step(kwargs):
    end = kwargs.get("end_step", -1)
    return (end if end >= 0 else kwargs["begin_step"] + 200) + 10


def test_agrees_with_tfmot_at_every_step():
    # tfmot is imported in a child process only: importing it switches tf.keras to legacy Keras.
    code = textwrap.dedent(
        """
        import inspect, json, sys
        import tensorflow_model_optimization as tfmot
        from prune.core.schedules import as_schedule
        cases, lasts = json.loads(sys.argv[1])
        out = []
        for (name, kwargs), last in zip(cases, lasts):
            theirs = getattr(tfmot.sparsity.keras, name)(**kwargs)
            converted = as_schedule(theirs)  # a tfmot object is accepted where ours is
            rows = []
            for step in range(last + 1):
                should, sparsity = theirs(step)
                rows.append([bool(should.numpy()), float(sparsity.numpy()), list(converted(step))])
            out.append(rows)
        k = tfmot.sparsity.keras
        names = sorted(n for n in dir(k) if not n.startswith("_"))
        configs = [getattr(k, name)(**kwargs).get_config() for name, kwargs in cases]
        print(json.dumps([out, names, list(inspect.signature(k.prune_low_magnitude).parameters), configs]))
        """
    )
    payload = json.dumps([CASES, [_last_step(k) for _, k in CASES]])
    res = subprocess.run([sys.executable, "-c", code, payload], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    theirs_all, names, params, configs = json.loads(res.stdout.strip().splitlines()[-1])
    # Every public name of tfmot.sparsity.keras exists in prune, and every argument of its prune_low_magnitude
    # is one of ours, with the positional ones in tfmot's order.
    assert "prune_low_magnitude" in names and len(names) == 11
    assert [n for n in names if not hasattr(prune, n)] == []
    ours = inspect.signature(prune.prune_low_magnitude).parameters
    assert [p for p in params if p not in ours] == []
    positional = [p for p in params if p != "kwargs"]
    assert list(ours)[: len(positional)] == positional
    # A tfmot schedule's get_config() and ours have the same {"class_name", "config"} form and values.
    for (name, kwargs), config in zip(CASES, configs):
        assert getattr(prune, name).from_config(config) == getattr(prune, name)(**kwargs)
        assert keras.saving.deserialize_keras_object(config) == getattr(prune, name)(**kwargs)
    for (name, kwargs), rows in zip(CASES, theirs_all):
        ours = getattr(prune, name)(**kwargs)
        for step, (t_should, t_sparsity, converted) in enumerate(rows):
            o_should, o_sparsity = ours(step)
            assert o_should == t_should, (name, kwargs, step)
            assert np.float32(o_sparsity) == np.float32(t_sparsity), (name, kwargs, step, o_sparsity, t_sparsity)
            assert converted == [o_should, o_sparsity]


def test_constant_values():
    s = prune.ConstantSparsity(0.75, begin_step=10, end_step=30, frequency=10)
    assert [s(t)[0] for t in (9, 10, 11, 20, 30, 31, 40)] == [False, True, False, True, True, False, False]
    assert s(0)[1] == 0.75


def test_polynomial_values():
    s = prune.PolynomialDecay(0.0, 0.8, begin_step=0, end_step=10, power=1, frequency=1)
    assert s(0) == (True, 0.0)
    assert s(5)[1] == pytest.approx(0.4, abs=1e-7)
    assert s(10) == (True, float(np.float32(0.8)))
    assert s(20)[0] is False and s(20)[1] == float(np.float32(0.8))


def test_one_shot():
    s = prune.OneShot(0.9, step=4)
    assert [s(t)[0] for t in range(7)] == [False, False, False, False, True, False, False]


@pytest.mark.parametrize(
    "schedule",
    [
        prune.ConstantSparsity(0.5, 3, 40, 7),
        prune.PolynomialDecay(0.1, 0.9, 2, 90, power=2, frequency=4),
        prune.OneShot(0.95, 12),
    ],
)
def test_config_round_trip(schedule):
    config = schedule.get_config()
    assert config == {"class_name": type(schedule).__name__, "config": dataclasses.asdict(schedule)}  # tfmot's form
    again = type(schedule).from_config(config)
    assert again == schedule and type(schedule).from_config(config["config"]) == schedule
    # Keras's own (de)serialiser gives the schedule back, from get_config() and from its own serialised form.
    assert keras.saving.deserialize_keras_object(json.loads(json.dumps(config))) == schedule
    assert keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(schedule)) == schedule
    assert schedule_from_config(json.loads(json.dumps(serialize_schedule(schedule)))) == schedule
    with pytest.raises(Exception):
        schedule.begin_step = 5  # frozen


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: prune.ConstantSparsity(1.0, 0), r"target_sparsity must be in \[0, 1\), got 1.0"),
        (lambda: prune.ConstantSparsity(-0.1, 0), r"target_sparsity must be in \[0, 1\), got -0.1"),
        (lambda: prune.PolynomialDecay(0.0, 1.2, 0, 10), r"final_sparsity must be in \[0, 1\), got 1.2"),
        (lambda: prune.PolynomialDecay(0.0, 0.5, 20, 10), r"begin_step must be <= end_step, got begin_step=20, end_step=10"),
        (lambda: prune.PolynomialDecay(0.0, 0.5, 0, -1), r"end_step must be >= 0, got -1"),
        (lambda: prune.ConstantSparsity(0.5, 0, frequency=0), r"frequency must be > 0, got 0"),
        (lambda: prune.ConstantSparsity(0.5, -3), r"begin_step must be >= 0, got -3"),
        (lambda: prune.OneShot(0.5, step=-1), r"step must be >= 0, got -1"),
        (lambda: prune.OneShot("a lot"), r"sparsity must be a number in \[0, 1\), got 'a lot'"),
        (lambda: as_schedule(42), r"pruning_schedule must be a schedule"),
        (lambda: schedule_from_config({"class_name": "Cosine", "config": {}}), r"unknown pruning_schedule class 'Cosine'"),
        (lambda: prune.OneShot.from_config({"class_name": "ConstantSparsity", "config": {}}),
         r"config is for class_name 'ConstantSparsity', not 'OneShot'"),
        (lambda: prune.register_schedule(dict), r"cls must be a subclass of prune.PruningSchedule"),
    ],
)
def test_bad_input(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_callable_schedule_is_accepted():
    s = as_schedule(lambda step: (step % 2 == 0, 0.25))
    assert s(4) == (True, 0.25) and s(5) == (False, 0.25)


@keras.saving.register_keras_serializable(package="tests")
class EveryOther:
    """A user's callable schedule, registered with Keras (not a prune.PruningSchedule)."""

    def __init__(self, sparsity):
        self.sparsity = sparsity

    def __call__(self, step):
        return step % 2 == 0, self.sparsity

    def get_config(self):
        return {"sparsity": self.sparsity}


class Unregistered(EveryOther):
    pass


def test_model_with_callable_schedule_saves_and_loads(tmp_path):
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(6)])
    pm = prune.prune_low_magnitude(model, EveryOther(0.5))
    config = pm.layers[0].get_config()["pruning_schedule"]
    assert config["class_name"] == "CallableSchedule" and config["config"]["fn"]["registered_name"] == "tests>EveryOther"
    pm.save(tmp_path / "m.keras")
    loaded = keras.models.load_model(tmp_path / "m.keras")
    schedule = loaded.layers[0].pruning_schedule
    assert isinstance(schedule.fn, EveryOther) and schedule.fn.sparsity == 0.5
    assert [schedule(t) for t in (2, 3)] == [(True, 0.5), (False, 0.5)]
    # The pruned layer is rebuilt with the same config, and the schedule's config round-trips.
    assert loaded.layers[0].get_config()["pruning_schedule"] == config
    unreg = prune.prune_low_magnitude(keras.Sequential([keras.Input((4,)), keras.layers.Dense(6)]), Unregistered(0.5))
    unreg.save(tmp_path / "u.keras")
    with pytest.raises(Exception, match=r"(?s)cannot rebuild the callable pruning_schedule.*register_keras_serializable"):
        keras.models.load_model(tmp_path / "u.keras")
    with pytest.raises(ValueError, match=r"has no get_config\(\); it cannot be saved"):
        as_schedule(lambda step: (True, 0.5)).get_config()
