"""Patterns, criteria and distributions: exact masks and values on tiny inputs."""

import re

import numpy as np
import pytest

from prune.core import distributions, masks, scoring
from prune.core.patterns import Block, Channel, NByM, Unstructured, as_pattern, pattern_from_args, serialize_pattern
from prune.core.scoring import ScoreContext

F, T = False, True


def test_unstructured_is_topk():
    s = np.array([[0.1, 0.9], [-0.2, 0.5]])
    np.testing.assert_array_equal(Unstructured().select(np.abs(s), 0.5), [[F, T], [F, T]])


@pytest.mark.parametrize("pooling, expected", [("AVG", [[F, F, T, T]]), ("MAX", [[T, T, F, F]])])
def test_block_pooling(pooling, expected):
    # Blocks (0, 9) and (5, 5): mean 4.5 < 5 but max 9 > 5.
    keep = Block((1, 2), pooling).select(np.array([[0.0, 9.0, 5.0, 5.0]]), 0.5)
    np.testing.assert_array_equal(keep, expected)


def test_block_edge_tiles_average_their_own_entries():
    # 3x3 in 2x2 tiles: [2 2 / 2 2] mean 2, right column (0, 0), bottom row (0, 0), corner (3) mean 3.
    # Counting padding as zeros would make the corner 0.75 and prune it before the 2s.
    s = np.array([[2.0, 2.0, 0.0], [2.0, 2.0, 0.0], [0.0, 0.0, 3.0]])
    keep = Block((2, 2)).select(s, 0.75)
    np.testing.assert_array_equal(keep, [[F, F, F], [F, F, F], [F, F, T]])


def test_block_refuses_other_ranks_as_tfmot():
    # tfmot's Pruning._validate_block refuses every weight whose rank is not 2, size-1 axes or not.
    keep = Block((2, 1)).select(np.arange(4.0).reshape(2, 2), 0.5)  # 2x1 tiles are the columns (means 1 and 2)
    np.testing.assert_array_equal(keep, [[F, T], [F, T]])
    for shape in ((1, 1, 2, 2), (3, 4, 5)):
        with pytest.raises(ValueError, match="needs a 2-D weight, as in tfmot, but weight has shape " + re.escape(str(shape))):
            Block((2, 2)).select(np.ones(shape), 0.5)


@pytest.mark.parametrize("pattern", [Unstructured(keep_one=True), Block((2, 1), keep_one=True), Channel(keep_one=True)])
def test_keep_one_keeps_the_best_unit_at_any_sparsity(pattern):
    scores = np.array([[1.0, 4.0], [3.0, 2.0]])
    keep = pattern.select(scores, 0.9)
    assert keep[0, 1] and keep.sum() == {Unstructured: 1, Block: 2, Channel: 2}[type(pattern)]
    assert not type(pattern)().select(scores, 0.9).any()  # the default: exactly round(0.9 * units) pruned
    assert as_pattern(serialize_pattern(pattern)) == pattern
    assert "keep_one" not in serialize_pattern(type(pattern)())["config"]  # configs saved before it compare equal


def test_n_by_m_groups_run_along_the_input_axis():
    # Dense kernel [in=4, out=2]: column 0 keeps its 2 largest |w|, column 1 ties to the higher indices.
    w = np.array([[1.0, 5.0], [-4.0, 5.0], [3.0, 5.0], [2.0, 5.0]])
    keep = NByM(2, 4).select(np.abs(w))
    np.testing.assert_array_equal(keep, [[F, F], [T, F], [T, T], [F, T]])


@pytest.mark.parametrize("m, expected", [(1, [T, F, T, T, T]), (2, [T, F, F, F, T])])
def test_n_by_m_short_last_group_keeps_at_most_n_minus_m(m, expected):
    # in=5 with n=3: groups [3, 1, 2] and [4, 5] (tfmot pads the second with one zero).
    keep = NByM(m, 3).select(np.array([[3.0], [1.0], [2.0], [4.0], [5.0]]))
    np.testing.assert_array_equal(keep[:, 0], expected)


def test_n_by_m_conv_kernel_and_masks_only_shrink():
    s = np.array([4.0, 3.0, 2.0, 1.0]).reshape(1, 1, 4, 1)  # [kh, kw, in, out]
    prev = np.array([F, T, T, T]).reshape(1, 1, 4, 1)  # the largest was pruned earlier
    keep = NByM(2, 4).select(s, previous=prev)
    np.testing.assert_array_equal(keep.reshape(-1), [F, T, T, F])
    # A group already at more than m zeros stays as it is.
    keep2 = NByM(1, 4).select(s, previous=keep)
    np.testing.assert_array_equal(keep2, keep)


def test_channel_prunes_whole_output_units():
    w = np.array([[1.0, -5.0, 0.5, 2.0], [1.0, 4.0, -0.5, 2.0], [1.0, 0.0, 0.5, -2.0]])  # column sums of |w|: 3, 9, 1.5, 6
    keep = Channel().select(np.abs(w), 0.5)
    np.testing.assert_array_equal(keep, np.array([[F, T, F, T]] * 3))


def test_global_scope_over_blocks():
    scores = {"a": np.array([[1.0, 1.0, 8.0, 8.0]]), "b": np.array([[2.0, 2.0], [9.0, 9.0]])}
    keep = masks.global_masks(scores, 0.5, pattern=Block((1, 2)))
    np.testing.assert_array_equal(keep["a"], [[F, F, T, T]])
    np.testing.assert_array_equal(keep["b"], [[F, F], [T, T]])
    with pytest.raises(ValueError, match="cannot be used with scope='global'"):
        masks.global_masks(scores, 0.5, pattern=NByM(2, 4))


@pytest.mark.parametrize("pattern", [Unstructured(), Block((2, 3), "MAX"), NByM(1, 8), Channel()])
def test_patterns_round_trip_their_config(pattern):
    assert as_pattern(serialize_pattern(pattern)) == pattern


def test_tfmot_arguments_map_to_patterns():
    assert pattern_from_args() == Unstructured()
    assert pattern_from_args(block_size=(1, 1), block_pooling_type="MAX") == Unstructured()
    assert pattern_from_args(block_size=[2, 4], block_pooling_type="MAX") == Block((2, 4), "MAX")
    assert pattern_from_args(sparsity_m_by_n=[3, 8]) == NByM(3, 8)
    with pytest.raises(ValueError, match=r"sparsity_m_by_n must be two integers \(m, n\), got \(1, 2, 3\)"):
        pattern_from_args(sparsity_m_by_n=(1, 2, 3))


# -- criteria -------------------------------------------------------------------

W = np.array([0.5, -2.0, 1.0, -1.0])
G = np.array([4.0, 0.5, -3.0, -0.25])


@pytest.mark.parametrize(
    "name, expected",
    [
        ("magnitude", [0.5, 2.0, 1.0, 1.0]),
        ("snip", [2.0, 1.0, 3.0, 0.25]),  # |w g|, Lee et al. 2019
        ("taylor", [4.0, 1.0, 9.0, 0.0625]),  # (g w)^2, Molchanov et al. 2019
        ("movement", [-2.0, 1.0, 3.0, -0.25]),  # -w g, Sanh et al. 2020
    ],
)
def test_criterion_scores(name, expected):
    scores = scoring.get_criterion(name)(ScoreContext(W, gradient=G, key="d/kernel"))
    np.testing.assert_array_equal(scores, expected)


@pytest.mark.parametrize(
    "name, keep", [("magnitude", [F, T, F, T]), ("snip", [T, F, T, F]), ("movement", [F, T, T, F])]
)
def test_criteria_select_different_masks(name, keep):
    # magnitude ties 1.0 at indices 2 and 3: the lower index is pruned first.
    scores = scoring.get_criterion(name)(ScoreContext(W, gradient=G))
    np.testing.assert_array_equal(masks.topk_mask(scores, 0.5), keep)


def test_gradient_criteria_refuse_missing_gradient():
    with pytest.raises(ValueError, match=r"criterion 'snip' needs the gradient of 'd/kernel'.*gradient_data"):
        scoring.get_criterion("snip")(ScoreContext(W, key="d/kernel"))


def test_registered_criterion_is_one_function():
    scoring.register_criterion("test_abs_grad", lambda ctx: np.abs(ctx.gradient), needs=("gradient",))
    assert "test_abs_grad" in scoring.criteria()
    np.testing.assert_array_equal(scoring.get_criterion("test_abs_grad")(ScoreContext(W, gradient=G)), np.abs(G))
    with pytest.raises(ValueError, match=r"needs must be a tuple of \['gradient', 'slots'\], got 'gradient'"):
        scoring.register_criterion("bad", abs, needs="gradient")


# -- distributions --------------------------------------------------------------


def test_erk_matches_rigl_equation():
    # raw (sum/prod): a 30/200, b 25/100; eps = (100 + 50) / (0.15*200 + 0.25*100) = 150/55.
    sp = distributions.erk_sparsities({"a": (10, 20), "b": (20, 5)}, 0.5)
    assert sp["a"] == pytest.approx(1 - 150 / 55 * 0.15, abs=1e-12)
    assert sp["b"] == pytest.approx(1 - 150 / 55 * 0.25, abs=1e-12)


def test_erk_makes_small_layers_dense_and_counts_are_exact():
    shapes = {"big": (100, 100), "tiny": (2, 2)}
    sp = distributions.erk_sparsities(shapes, 0.5)
    assert sp["tiny"] == 0.0
    assert sp["big"] == pytest.approx(1 - 4998 / 10000, abs=1e-12)  # rigl: rhs 5000 - 2, divisor 200
    zeros = distributions.erk_zeros(shapes, 0.5)
    assert zeros == {"big": 5002, "tiny": 0} and sum(zeros.values()) == round(0.5 * 10004)


def test_erk_zeros_exact_total_with_fractions():
    shapes = {"a": (3, 7), "b": (5, 5), "c": (2, 3, 4)}
    for s in (0.1, 0.33, 0.5, 0.9):
        zeros = distributions.erk_zeros(shapes, s)
        assert sum(zeros.values()) == round(s * (21 + 25 + 24))


LENET = {"fc1/kernel": (784, 300), "fc2/kernel": (300, 100), "out/kernel": (100, 10)}


def _rigl_counts(shapes, sparsity):
    """rigl's zeros per weight: floor(s_l * n_l) of its ERK sparsities (the equation, evaluated independently here)."""
    sizes = {k: int(np.prod(v)) for k, v in shapes.items()}
    raw = {k: sum(v) / sizes[k] for k, v in shapes.items()}
    dense: set = set()
    while True:
        rhs = sum(sizes[k] - np.floor(sparsity * sizes[k]) for k in shapes if k not in dense)
        rhs -= sum(np.floor(sparsity * sizes[k]) for k in dense)
        eps = rhs / sum(raw[k] * sizes[k] for k in shapes if k not in dense)
        top = max(raw[k] for k in shapes if k not in dense)
        if top * eps <= 1:
            return {k: 0 if k in dense else int(np.floor((1 - eps * raw[k]) * sizes[k])) for k in shapes}
        dense |= {k for k in shapes if k not in dense and raw[k] == top}


def test_erk_matches_rigl_counts_and_keeps_its_dense_layer_dense():
    """LeNet-300-100 at 90%: ERK makes the 100x10 layer dense; every count within one of rigl's, the total exact."""
    rigl = _rigl_counts(LENET, 0.9)
    assert rigl["out/kernel"] == 0
    for s in (0.9, float(np.float32(0.9))):  # exact, and what ConstantSparsity(0.9) hands the engine
        zeros = distributions.erk_zeros(LENET, distributions.configured_target(s))
        assert zeros["out/kernel"] == 0, s
        assert all(abs(zeros[k] - rigl[k]) <= 1 for k in LENET), (zeros, rigl)
        assert sum(zeros.values()) == round(0.9 * sum(int(np.prod(v)) for v in LENET.values()))
    # Without the configured target the float32 value's floors drift, but the dense layer still gets no zero.
    drifted = distributions.erk_zeros(LENET, float(np.float32(0.9)))
    assert drifted["out/kernel"] == 0 and drifted != distributions.erk_zeros(LENET, 0.9)


def test_configured_target_is_the_shortest_float32_decimal():
    assert distributions.configured_target(np.float32(0.9)) == 0.9
    assert distributions.configured_target(float(np.float32(0.95))) == 0.95
    assert distributions.configured_target(0.7234567) == 0.7234567
    assert np.float32(distributions.configured_target(np.float32(1 / 3))) == np.float32(1 / 3)


def test_engine_erk_at_constant_sparsity_keeps_the_dense_layer_dense():
    """The engine with ConstantSparsity(0.9) and scope='erk' on a real LeNet-300-100: rigl's counts, 1000 of 1000 kept."""
    import keras

    import prune

    model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(300, name="fc1"),
                              keras.layers.Dense(100, name="fc2"), keras.layers.Dense(10, name="out")])
    pruned = prune.prune_low_magnitude(model, prune.ConstantSparsity(0.9, begin_step=0), scope="erk")
    prune.update_masks(pruned, 0)
    kept = {layer.name.split("prune_low_magnitude_")[-1]: layer.get_masks()["kernel"] for layer in pruned.layers}
    zeros = {f"{k}/kernel": int((~m.astype(bool)).sum()) for k, m in kept.items()}
    assert zeros == distributions.erk_zeros(LENET, 0.9)
    assert int(kept["out"].sum()) == 1000


def test_uniform_zeros():
    assert distributions.uniform_zeros({"a": (5,), "b": (7,)}, 0.5) == {"a": 2, "b": 4}
