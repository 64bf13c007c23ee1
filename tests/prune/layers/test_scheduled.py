"""The scheduled-layer contract (prune/layers/scheduled.py) and layer-kind registration (prune/layers/kinds.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest

import prune
from prune.layers.kinds import LAYER_KINDS, MASKED_TWINS, register_layer
from prune.layers.masked import MaskedDense
from prune.layers.scheduled import PRUNING_KEYS, PruningParams, ScheduledLayer, keeps_step, pruning_params_of
from prune.layers.sparse import SparseDense

ROOT = Path(__file__).resolve().parents[3]

PARAMS = [
    PruningParams(),
    PruningParams(prune.ConstantSparsity(0.5, 0, frequency=1), prune.NByM(2, 4), "random", "layer", 3),
    PruningParams(prune.PolynomialDecay(0.0, 0.8, 0, 10, frequency=2), prune.Block((1, 4)), "magnitude", "global", 0),
    PruningParams(prune.OneShot(0.9, 5), None, "magnitude", "erk", 7),
]


@pytest.mark.parametrize("params", PARAMS, ids=repr)
def test_params_round_trip_through_their_config(params):
    config = json.loads(json.dumps(params.get_config()))  # as a .keras file stores it
    assert list(config) == list(PRUNING_KEYS)
    assert PruningParams.from_config(config) == params


def test_params_normalise_and_validate():
    params = PruningParams({"class_name": "ConstantSparsity", "config": {"target_sparsity": 0.5, "begin_step": 0}},
                           None, seed=np.int64(2))
    assert params.pruning_schedule == prune.ConstantSparsity(0.5, 0)
    assert params.pattern == prune.Unstructured() and type(params.seed) is int and params.seed == 2
    with pytest.raises(ValueError, match=r"unknown criterion 'l3'"):
        PruningParams(criterion="l3")
    with pytest.raises(ValueError, match=r"unknown scope 'model'"):
        PruningParams(scope="model")
    with pytest.raises(ValueError, match=r"needs scope='layer', got scope='global'"):
        PruningParams(pattern=prune.NByM(2, 4), scope="global")
    with pytest.raises(ValueError, match=r"seed must be an integer, got True"):
        PruningParams(seed=True)


@pytest.mark.parametrize("make", [lambda **kw: MaskedDense(3, **kw), lambda **kw: SparseDense(3, **kw)],
                         ids=["MaskedDense", "SparseDense"])
def test_masked_and_sparse_layers_share_one_contract(make):
    kwargs = dict(pruning_schedule=prune.ConstantSparsity(0.5, 0), pattern=prune.Block((1, 2)), criterion="random",
                  scope="global", seed=4)
    layer = make(**kwargs)
    assert isinstance(layer, ScheduledLayer) and keeps_step(layer)
    assert pruning_params_of(layer) == PruningParams(**kwargs)
    assert {k: getattr(layer, k) for k in PRUNING_KEYS} == kwargs
    config = layer.get_config()
    assert {k: config[k] for k in PRUNING_KEYS} == PruningParams(**kwargs).get_config()
    assert pruning_params_of(type(layer).from_config(config)) == layer.pruning_params
    layer.pruning_schedule = None  # a static mask from now on (sparse_init, IMP's rewind)
    assert layer.pruning_params == PruningParams(None, prune.Block((1, 2)), "random", "global", 4)
    with pytest.raises(ValueError, match=r"pruning_schedule must be a schedule"):
        layer.pruning_schedule = "often"
    assert pruning_params_of(keras.layers.Dense(3)) is None and not keeps_step(keras.layers.Dense(3))


def test_one_call_registers_a_layer_kind(tmp_path):
    """A new kind is serialisable, reachable as prune.layers.<Name> and, with prunes=, a twin prune_low_magnitude uses."""

    class Plain(keras.layers.Dense):
        pass

    @register_layer(prunes=Plain)
    class MaskedPlainForTest(MaskedDense, Plain):
        pass

    try:
        assert prune.layers.MaskedPlainForTest is MaskedPlainForTest and MASKED_TWINS[Plain] is MaskedPlainForTest
        assert MaskedPlainForTest.base_class is keras.layers.Dense  # inherited from MaskedDense, kept
        assert keras.saving.get_registered_name(MaskedPlainForTest) == "prune>MaskedPlainForTest"
        model = keras.Sequential([keras.Input((4,)), Plain(3)])
        pruned = prune.prune_low_magnitude(model, pruning_schedule=prune.ConstantSparsity(0.5, 0))
        assert type(pruned.layers[0]) is MaskedPlainForTest
        pruned.save(tmp_path / "m.keras")
        loaded = keras.models.load_model(tmp_path / "m.keras")
        assert type(loaded.layers[0]) is MaskedPlainForTest
        assert loaded.layers[0].pruning_params == pruned.layers[0].pruning_params
        with pytest.raises(ValueError, match=r"must subclass layer_class"):
            register_layer(prunes=keras.layers.Conv1D)(type("Other", (MaskedDense,), {}))
    finally:
        LAYER_KINDS.pop("MaskedPlainForTest", None)
        MASKED_TWINS.pop(Plain, None)


def test_the_contract_imports_without_tensorflow():
    """prune.layers and its contract are NumPy only; the layer kinds load on first use."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="3")
    code = (
        "import json, sys\nimport prune.layers, prune.layers.scheduled, prune.layers.kinds\n"
        "before = sorted(m for m in ('tensorflow', 'keras') if m in sys.modules)\n"
        "kind = prune.layers.SparseDense.__name__\n"
        "print(json.dumps(dict(before=before, kind=kind)))"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"before": [], "kind": "SparseDense"}
