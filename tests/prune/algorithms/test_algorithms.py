"""prune.algorithms: the base, the registry, and MEST and GraNet against hand-computed masks on tiny weights."""

import keras
import numpy as np
import pytest

import prune
import prune.training.dst  # prune.training.dst.METHODS below
from prune.algorithms import (
    GradualPruning,
    GraNet,
    LotteryLevel,
    MEST,
    MaskAlgorithm,
    SET,
    SparseTraining,
    Update,
    algorithms,
    get_algorithm,
    register_algorithm,
)
from prune.layers.sparse import SparseDense
from prune.layers.optimizer_state import slots_for
from tests.helpers import mlp, mlp_data


def _update(weight, keep, gradient=None, key="w", seed=0, step=1):
    weight = np.asarray(weight, np.float64)
    return Update(key, weight, np.asarray(keep, bool), None if gradient is None else np.asarray(gradient, np.float64),
                  np.random.default_rng([seed, step]))


# -- the registry ---------------------------------------------------------------------------------------------


def test_the_registry_names_every_algorithm_and_what_it_needs():
    assert algorithms() == ["gradual", "granet", "imp", "magnitude", "mest", "rigl", "set", "sparsegpt", "static", "wanda"]
    assert algorithms("sparse_training") == ["granet", "mest", "rigl", "set", "static"]
    assert algorithms("pruning") == ["gradual"] and algorithms("lottery") == ["imp"] and algorithms("oneshot") == ["magnitude", "sparsegpt", "wanda"]
    assert algorithms(moving=True) == ["granet", "mest", "rigl", "set"] == list(prune.training.dst.METHODS)
    assert algorithms(needs_gradient=True) == ["granet", "mest", "rigl"]
    assert get_algorithm("rigl").grow_criterion == "gradient" and get_algorithm("set").grow_criterion == "random"
    assert all(issubclass(get_algorithm(n), MaskAlgorithm) for n in algorithms())
    with pytest.raises(ValueError, match=r"method must be one of \['gradual', 'granet', 'imp', .*\], got 'snip'"):
        get_algorithm("snip")
    with pytest.raises(ValueError, match=r"method must be one of \['granet', 'mest', 'rigl', 'set', 'static'\], got 'imp'"):
        get_algorithm("imp", kind="sparse_training")
    with pytest.raises(ValueError, match=r"kind must be one of \['pruning', 'sparse_training', 'lottery', 'oneshot'\]"):
        algorithms("dense")
    with pytest.raises(ValueError, match=r"method must be one of \['granet', 'mest', 'rigl', 'set'\], got 'gradual'"):
        prune.DynamicSparsity("gradual")
    with pytest.raises(ValueError, match="registered already"):
        register_algorithm(type("Other", (SET,), {"name": "set"}))
    with pytest.raises(ValueError, match="lower-case identifier"):
        register_algorithm(type("Bad", (SET,), {"name": "Not A Name"}))
    with pytest.raises(ValueError, match=r"algorithm 'odd' has kind 'other'; a kind must be one of"):
        register_algorithm(type("Odd", (MaskAlgorithm,), {"name": "odd", "kind": "other"}))
    with pytest.raises(ValueError, match="cls must be a subclass of MaskAlgorithm"):
        register_algorithm(dict)


def test_a_new_algorithm_is_one_subclass_and_one_registration(monkeypatch):
    """An algorithm that drops the *largest* live weights: reachable by name from DynamicSparsity, nothing else edited."""
    from prune.algorithms import base

    monkeypatch.setattr(base, "_REGISTRY", dict(base._REGISTRY))  # undone after the test

    @register_algorithm
    class DropLargest(SET):
        name = "drop_largest"

        def drop_scores(self, u):
            return -np.abs(u.weight)

    assert "drop_largest" in prune.training.dst.METHODS
    model = prune.prune_low_magnitude(mlp())
    prune.sparse_init(model, 0.5)
    layer = prune.prunable_layers(model)[0]
    w, before = layer.kernel.numpy(), layer.get_masks()["kernel"]
    cb = prune.DynamicSparsity("drop_largest", update_every=1, drop_fraction=0.25)
    cb.set_model(model)
    cb.update(1)
    after = layer.get_masks()["kernel"]
    dropped = before & ~after
    n = cb.history[0]["n"]
    threshold = np.sort(np.abs(w[before]))[::-1][n - 1]  # the n-th largest live |w|
    assert dropped.sum() > 0 and np.abs(w[dropped]).min() >= threshold  # only the largest went (a few grew back)


# -- MEST ------------------------------------------------------------------------------------------------------


def test_mest_drops_by_magnitude_plus_lambda_gradient():
    w = [0.1, -0.9, 0.0, 0.5, -0.2, 0.0]
    keep = [True, True, False, True, True, False]
    g = [2.0, 0.0, 1.0, 0.0, 0.05, 3.0]
    # live drop scores |w| + 1 * |g|: 2.1, 0.9, 0.5, 0.25; floor(4 * 0.5) = 2 drop: indices 4 and 3
    mest = MEST(lam=1.0, drop_fraction=0.5)
    np.testing.assert_allclose(mest.drop_scores(_update(w, keep, g)), [2.1, 0.9, 1.0, 0.5, 0.25, 3.0])
    (new, n), = mest.plan([_update(w, keep, g)], step=1)
    assert n == 2 and new.sum() == 4
    assert new[0] and new[1]  # kept: the large gradient saved 0.1
    assert set(np.flatnonzero(new)) - {0, 1} <= {2, 3, 4, 5}  # two grown at random among the rest
    # lam = 0 is SET's drop: 0.1 and -0.2 go, 0.5 stays
    (set_new, _), = MEST(lam=0.0, drop_fraction=0.5).plan([_update(w, keep, g)], step=1)
    (ref, _), = SET(drop_fraction=0.5).plan([_update(w, keep, g)], step=1)
    np.testing.assert_array_equal(set_new, ref)
    with pytest.raises(ValueError, match=r"lam must be a number in \[0, inf\), got -1"):
        MEST(lam=-1)
    with pytest.raises(ValueError, match="method='mest' scores with the gradient: pass gradient_data"):
        prune.DynamicSparsity("mest")


# -- GraNet ----------------------------------------------------------------------------------------------------


def test_granet_schedule_is_the_cubic_of_the_authors_code():
    g = GraNet(final_sparsity=0.5, initial_sparsity=0.0, update_every=1, prune_end_step=4, decay="constant")
    assert [g.sparsity_at(s) for s in range(6)] == [0.0, 0.5 * (1 - 0.75**3), 0.5 * (1 - 0.5**3), 0.5 * (1 - 0.25**3),
                                                    0.5, 0.5]
    assert g.sparsity_at(2) == 0.4375 and g.start_sparsity(0.5) == 0.0
    by_ten = GraNet(final_sparsity=0.8, initial_sparsity=0.5, update_every=10, prune_begin_step=20, prune_end_step=60,
                    decay="constant")
    assert by_ten.sparsity_at(29) == 0.5 and by_ten.sparsity_at(40) == 0.5 + (0.8 - 0.5) * (1 - 0.5**3)  # whole updates
    assert by_ten.start_sparsity(0.8) == 0.5


def test_granet_layer_scope_prunes_to_the_schedule_then_exchanges_ceil_fraction():
    w = [0.1, -0.8, 0.3, 0.05, -0.6, 0.7, 0.2, -0.4]
    g = [0.0, 0.0, 5.0, 0.0, 0.0, 0.0, 1.0, 9.0]
    alg = GraNet(final_sparsity=0.5, update_every=1, prune_end_step=4, scope="layer", drop_fraction=0.5,
                 decay="constant")
    # step 2: sparsity 0.4375, round(3.5) = 4 zeros: keep -0.8, -0.6, 0.7, -0.4 (indices 1, 4, 5, 7);
    # then ceil(0.5 * 4) = 2 dropped by |w| (7: -0.4 and 4: -0.6) and 2 grown by |g| among 0, 2, 3, 4, 6, 7: 7 and 2
    (new, n), = alg.plan([_update(w, [True] * 8, g)], step=2)
    assert n == 2
    np.testing.assert_array_equal(np.flatnonzero(new), [1, 2, 5, 7])


def test_granet_global_scope_spreads_the_sparsity_by_one_threshold():
    a, b = [0.1, 0.9, 0.3, 0.4], [0.2, 0.05]
    alg = GraNet(final_sparsity=0.5, update_every=1, prune_end_step=1, drop_fraction=0.01, decay="constant")
    ups = [_update(a, [True] * 4, [1.0, 2.0, 0.0, 0.0], key="a"), _update(b, [True] * 2, [5.0, 5.0], key="b")]
    # 6 entries at 0.5: keep the 3 largest |w| of all (0.9, 0.4, 0.3, all in a); then ceil(0.01 * 3) = 1 exchange in a:
    # 0.3 dropped, index 0 grown (|g| 1 against 0 at index 2); b keeps nothing, exchanges nothing
    (new_a, n_a), (new_b, n_b) = alg.plan(ups, step=5)
    np.testing.assert_array_equal(np.flatnonzero(new_a), [0, 1, 3])
    assert n_a == 1 and n_b == 0 and not new_b.any()


def test_granet_never_regrows_past_the_schedule_and_checks_its_arguments():
    alg = GraNet(final_sparsity=0.5, update_every=1, prune_end_step=2, scope="layer", decay="constant")
    w = np.arange(1.0, 9.0)
    keep = np.array([True, True, False, False, False, False, False, False])  # 2 live, sparser than the schedule
    (new, _), = alg.plan([_update(w, keep, np.ones(8))], step=1)
    assert new.sum() == 2  # the pruning only removes
    for kwargs, message in [
        ({"final_sparsity": 1.0}, r"final_sparsity must be a number in \[0, 1\), got 1.0"),
        ({"initial_sparsity": 0.95}, r"initial_sparsity must be a number in \[0, final_sparsity=0.9\], got 0.95"),
        ({"scope": "erk"}, r"scope must be one of \['global', 'layer'\], got 'erk'"),
        ({"prune_end_step": None}, "GraNet needs prune_end_step"),
        ({"prune_begin_step": 50}, "prune_end_step must be after prune_begin_step=50, got 10"),
    ]:
        args = {"prune_end_step": 10, "decay": "constant", **kwargs}
        with pytest.raises(ValueError, match=message):
            GraNet(**args)


@pytest.mark.parametrize("kind", ["masked", "sparse_dense"])
def test_granet_in_fit_follows_its_schedule_with_exact_zeros(kind):
    keras.utils.set_random_seed(0)
    model = prune.prune_low_magnitude(mlp())
    if kind == "sparse_dense":
        prune.sparse_init(model, 0.0)
        model = prune.convert(model, to="sparse")
    optimizer = keras.optimizers.Adam(0.01)
    model.compile(optimizer, keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    prune.sparse_init(model, 0.0, optimizer=optimizer)  # dense-to-sparse: every entry live
    x, y = mlp_data(64)
    cb = prune.DynamicSparsity("granet", update_every=4, end_step=16, final_sparsity=0.8, prune_end_step=12,
                               gradient_data=(x[:16], y[:16]))
    totals = []

    class Watch(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            live = 0
            for t in prune.core.targets.mask_targets(self.model):
                keep, w = t.keep, t.weight
                live += int(keep.sum())
                assert np.all(w[~keep] == 0.0) and not np.signbit(w[~keep]).any(), t.key
                if kind == "masked":
                    for slot in slots_for(optimizer, t.layer.kernel):
                        assert np.all(slot.numpy()[~keep] == 0.0), slot.path
            totals.append(live)

    model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0, callbacks=[cb, Watch()])
    n = sum(t.keep.size for t in prune.core.targets.mask_targets(model))
    alg = cb.algorithm
    for step in (4, 8, 12):  # after the update at `step`, the total live count is the schedule's (global scope)
        want = n - int(np.round(alg.sparsity_at(step) * n))
        assert totals[step] == want, (step, totals[step], want)
    assert totals == sorted(totals, reverse=True) and totals[-1] == n - int(np.round(0.8 * n))
    assert sum(r["grown"] for r in cb.history) > 0  # the regeneration moved entries too


# -- gradual pruning and IMP's level step: the same base, other callers -------------------------------------------


def _params(sparsity=0.5, scope="layer", pattern=None, criterion="magnitude", begin=0, frequency=1):
    from prune.layers.scheduled import PruningParams

    return PruningParams(prune.ConstantSparsity(sparsity, begin_step=begin, frequency=frequency),
                         pattern, criterion, scope, 0)


def test_gradual_pruning_selects_each_weight_by_its_own_settings_and_only_shrinks():
    alg = GradualPruning()
    a = Update("a/kernel", np.array([[0.3, -0.1], [0.0, 0.7]]), np.array([[True, True], [False, True]]),
               params=_params(0.5), layer="a")
    b = Update("b/kernel", np.array([0.4, -0.5, 0.2, 0.1]), np.ones(4, bool), params=_params(0.75, begin=10), layer="b")
    assert alg.due([a, b], 0) == [a]  # b's schedule begins at step 10: not due, and its weight is never read
    # a: round(0.5 * 4) = 2 zeros: the pruned 0.0, then the smallest live |w| = 0.1
    (new, n), = alg.plan([a], 0)
    np.testing.assert_array_equal(new, [[True, False], [False, True]])
    assert n == 1  # one entry newly pruned
    # b at step 10: round(0.75 * 4) = 3 zeros, the kept one is |-0.5|
    (new_b, n_b), = alg.plan([b], 10)
    np.testing.assert_array_equal(new_b, [False, True, False, False])
    assert n_b == 3


def test_gradual_pruning_global_groups_share_one_threshold_and_one_schedule():
    alg = GradualPruning()
    a = Update("a/kernel", np.array([0.9, 0.1, 0.5]), np.ones(3, bool), params=_params(0.5, "global"), layer="a")
    b = Update("b/kernel", np.array([0.2, 0.8, 0.05]), np.ones(3, bool), params=_params(0.5, "global"), layer="b")
    # round(0.5 * 6) = 3 zeros over both: 0.05, 0.1, 0.2
    (ka, na), (kb, nb) = alg.plan([a, b], 0)
    np.testing.assert_array_equal(ka, [True, False, True])
    np.testing.assert_array_equal(kb, [False, True, False])
    assert (na, nb) == (1, 2)
    other = Update("c/kernel", np.ones(2), np.ones(2, bool), params=_params(0.25, "global"), layer="c")
    with pytest.raises(ValueError, match=r"weights with scope='global' must share one pruning_schedule"):
        alg.due([a, other], 0)
    bad = Update("a/kernel", np.array([np.nan, 1.0, 2.0]), np.ones(3, bool), params=_params(0.5), layer="a")
    with pytest.raises(ValueError, match=r"weight 'a/kernel' \(layer 'a'\) has 1 NaN or infinite entries; no mask was changed"):
        alg.plan([bad], 0)


def test_imp_level_prunes_the_survivors_by_magnitude_layerwise_or_globally():
    a = Update("a/kernel", np.array([0.9, 0.1, 0.0, 0.5]), np.array([True, True, False, True]))
    b = Update("b/kernel", np.array([0.2, 0.8, 0.05, 0.3]), np.ones(4, bool))
    # layer: round(0.5 * 4) = 2 zeros each; a keeps 0.9 and 0.5 (the pruned 0.0 stays pruned), b keeps 0.8 and 0.3
    (ka, na), (kb, nb) = LotteryLevel(0.5, "layer").plan([a, b])
    np.testing.assert_array_equal(ka, [True, False, False, True])
    np.testing.assert_array_equal(kb, [False, True, False, True])
    assert (na, nb) == (1, 2)
    # global at 0.75: round(0.75 * 8) = 6 zeros: 0.9 and 0.8 survive
    (ka, _), (kb, _) = LotteryLevel(0.75, "global").plan([a, b])
    np.testing.assert_array_equal(ka, [True, False, False, False])
    np.testing.assert_array_equal(kb, [False, True, False, False])
    with pytest.raises(ValueError, match=r"sparsity must be a number in \[0, 1\), got 1.0"):
        LotteryLevel(1.0)
    with pytest.raises(ValueError, match=r"unknown scope 'rows'; valid: \['layer', 'global', 'erk'\]"):
        LotteryLevel(0.5, "rows")
