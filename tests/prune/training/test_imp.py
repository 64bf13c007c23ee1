"""prune.training.imp: IMP's level loop over a caller-supplied level store, and its one ImpParams."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest

import prune
from prune.training import imp
from tests.helpers import mlp, mlp_data

REPO = Path(__file__).resolve().parents[3]


class MemoryStore:
    """Levels in a dict: the smallest :class:`prune.training.imp.LevelStore`."""

    def __init__(self) -> None:
        self.records: dict[int, dict] = {}
        self.states: dict[tuple[int, str], tuple[dict, dict]] = {}

    def levels(self) -> list[int]:
        return sorted(self.records)

    def read(self, level):
        return copy.deepcopy(self.records.get(level))

    def state(self, level, name):
        return self.states[level, name]

    def write(self, level, record, states):
        for name, (values, masks) in states.items():
            self.states[level, name] = ({k: np.array(v) for k, v in values.items()}, {k: np.array(m) for k, m in masks.items()})
        self.records[level] = copy.deepcopy(record)


def _build():
    model = prune.prune_low_magnitude(mlp(seed=1), prune.ConstantSparsity(0.0, 0), seed=0)
    for layer in prune.prunable_layers(model):
        layer.pruning_schedule = None
    return model


def _fit(trained: list[tuple[int, str]]):
    x, y = mlp_data(n=32)

    def fit(model, level, variant, callbacks):
        trained.append((level, variant))
        model.compile(keras.optimizers.SGD(0.1), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        history = model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=callbacks)
        return imp.Trained("ok", {"train_loss": float(history.history["loss"][-1])}, {"steps": 4})

    return fit


def test_levels_run_in_memory_resume_and_reach_exact_counts():
    store, trained = MemoryStore(), []
    params = imp.ImpParams(rate=0.5, rewind_step=2, controls=("random",))
    out = imp.train_levels(_build, _fit(trained), 0.75, params, store, seed=3)
    assert trained == [(0, "ticket"), (1, "ticket"), (1, "random"), (2, "ticket"), (2, "random")]
    assert [(r["level"], r["variant"], r["sparsity"]) for r in out.rows] == [
        (0, "ticket", 0.0), (1, "ticket", 0.5), (1, "random", 0.5), (2, "ticket", 0.75), (2, "random", 0.75)
    ]
    assert out.level == 2 and out.record["ticket"] == {"steps": 4} and store.levels() == [0, 1, 2]
    assert set(store.state(0, "rewind")[0]) == {v.path for v in _build().trainable_variables}
    masks = store.state(2, "ticket")[1]
    assert {k: int((~m).sum()) for k, m in masks.items()} == {"fc1/kernel": 144, "fc2/kernel": 36}  # round(0.75 n)
    # A store holding levels 0 and 1 trains level 2 only, to the same rows.
    again, trained2 = MemoryStore(), []
    again.records = {n: store.records[n] for n in (0, 1)}
    again.states = {k: v for k, v in store.states.items() if k[0] < 2}
    lines: list[str] = []
    resumed = imp.train_levels(_build, _fit(trained2), 0.75, params, again, seed=3, log=lines.append)
    assert trained2 == [(2, "ticket"), (2, "random")] and resumed.rows == out.rows
    assert sum("done before, skipped" in line for line in lines) == 2
    with pytest.raises(ValueError, match="was made for sparsity"):
        imp.train_levels(_build, _fit([]), 0.5, imp.ImpParams(rate=0.2), store)


def test_a_diverged_ticket_stops_the_loop_after_storing_its_level():
    store = MemoryStore()

    def fit(model, level, variant, callbacks):
        return imp.Trained("diverged" if level == 1 else "ok", {}, {})

    with pytest.raises(imp.TicketDiverged, match="diverged at level 1") as info:
        imp.train_levels(_build, fit, 0.75, imp.ImpParams(rate=0.5, controls=()), store)
    assert store.levels() == [0, 1] and (1, "ticket") not in store.states and info.value.level == 1


class LossyStore(MemoryStore):
    """A store whose read() returns its records without some keys (a store written for an older record)."""

    def __init__(self, drop: tuple[str, ...]) -> None:
        super().__init__()
        self.drop = drop

    def read(self, level):
        record = super().read(level)
        return None if record is None else {k: v for k, v in record.items() if k not in self.drop}

    def __str__(self) -> str:
        return "lossy"


def test_a_store_record_without_rows_is_named_with_the_store_level_and_key():
    trained: list[tuple[int, str]] = []
    resumed = LossyStore(("rows",))
    resumed.records[0] = dict(rows=[dict(level=0, variant="ticket", status="ok")], target_sparsity=0.0, ticket={})
    message = (
        "level 0 of store lossy: read(0) returned a record without 'rows' (its keys: ['target_sparsity', 'ticket']); "
        "a level record has keys ['target_sparsity', 'rows', 'ticket']"
    )
    with pytest.raises(ValueError) as info:  # a finished level read back: refused before anything trains
        imp.train_levels(_build, _fit(trained), 0.5, imp.ImpParams(rate=0.5, controls=()), resumed)
    assert str(info.value).startswith(message) and trained == [] and resumed.levels() == [0]

    def fit(model, level, variant, callbacks):
        return imp.Trained("ok", {}, {})

    fresh = LossyStore(("rows", "ticket"))  # the level just written, read back without them
    with pytest.raises(ValueError, match=r"^level 0 of store lossy: read\(0\) returned a record without 'rows', 'ticket' "):
        imp.train_levels(_build, fit, 0.5, imp.ImpParams(rate=0.5, controls=()), fresh)
    empty = MemoryStore()
    empty.records[0] = dict(rows=[], target_sparsity=0.0, ticket={})
    with pytest.raises(ValueError, match=r"^level 0 of store .*MemoryStore.*: read\(0\) returned a record whose 'rows' is \[\]"):
        imp.train_levels(_build, fit, 0.5, imp.ImpParams(rate=0.5, controls=()), empty)


@pytest.mark.parametrize(
    "kwargs, path, message",
    [
        (dict(rate=1.0), "rate", "must be a number in (0, 1), got 1.0"),
        (dict(rewind_step=True), "rewind_step", "must be an integer >= 0, got True"),
        (dict(controls=("random", "random")), "controls", "must be distinct names from ['reinit', 'random']"),
        (dict(stops=(0.5, 0.3)), "stops", "must be strictly increasing, got [0.5, 0.3]"),
        (dict(stops=(0.0,)), "stops[0]", "must be a sparsity in (0, 1), got 0.0"),
    ],
)
def test_imp_params_name_the_field(kwargs, path, message):
    with pytest.raises(imp.ParamError) as info:
        imp.ImpParams(**kwargs)
    assert info.value.path == path and info.value.message.startswith(message)


def test_controls_are_stored_in_one_order():
    assert imp.ImpParams(controls=["random", "reinit"]).controls == ("reinit", "random")
    assert imp.ImpParams(stops=[0.5, 0.8]).stops == (0.5, 0.8)


def test_the_runner_main_process_reads_prune_imp_without_tensorflow():
    code = (
        "import sys\n"
        "from experiments import axes, library_names\n"
        "assert axes.METHODS.get('imp').params is library_names.imp.ImpParams\n"
        "assert not [m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'keras')]\n"
        "assert sys.modules['prune.training.imp'] is library_names.imp\n"
        "from prune.training.imp import ImpParams\n"  # a worker's later import gets the same class
        "assert ImpParams is axes.ImpParams\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)
