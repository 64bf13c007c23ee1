"""Exact mask selection on tiny arrays."""

import numpy as np
import pytest

from prune.core import masks, patterns, scoring
from prune.core.scoring import ScoreContext


def test_magnitude_keeps_exactly_the_largest():
    w = np.array([0.1, 0.9, -0.2, 0.5])
    keep = masks.topk_mask(scoring.magnitude(ScoreContext(w)), 0.5)
    np.testing.assert_array_equal(keep, [False, True, False, True])


@pytest.mark.parametrize("n", [1, 7, 10, 97, 1000])
@pytest.mark.parametrize("sparsity", [0.0, 0.1, 0.25, 0.5, 0.9, 0.99])
def test_exact_counts(n, sparsity):
    w = np.random.default_rng(n).normal(size=n)
    keep = masks.topk_mask(np.abs(w), sparsity)
    assert (~keep).sum() == int(np.round(sparsity * n))


def test_round_half_to_even():
    assert patterns.num_zeros(0.5, 5) == 2  # 2.5 -> 2
    assert patterns.num_zeros(0.5, 7) == 4  # 3.5 -> 4
    assert patterns.num_zeros(0.9, 10) == 9


def test_ties_break_by_lower_index():
    keep = masks.topk_mask(np.ones(6), 0.5)
    np.testing.assert_array_equal(keep, [False, False, False, True, True, True])


def test_masks_only_shrink():
    scores = np.array([5.0, 4.0, 3.0, 2.0, 1.0, 0.5])
    prev = np.array([False, True, True, True, True, True])  # the largest was pruned earlier
    keep = masks.topk_mask(scores, 0.5, prev)
    np.testing.assert_array_equal(keep, [False, True, True, True, False, False])
    # A lower target than already reached leaves the mask unchanged.
    np.testing.assert_array_equal(masks.topk_mask(scores, 0.1, keep), keep)


def test_global_scope_one_threshold():
    scores = {"a": np.array([[1.0, 2.0], [3.0, 4.0]]), "b": np.array([0.5, 10.0, 0.7, 5.0])}
    keep = masks.global_masks(scores, 0.5)
    np.testing.assert_array_equal(keep["a"], [[False, False], [True, True]])
    np.testing.assert_array_equal(keep["b"], [False, True, False, True])
    assert sum((~k).sum() for k in keep.values()) == 4


def test_global_total_is_exact_with_ties_across_weights():
    scores = {"a": np.ones(3), "b": np.ones(3)}
    keep = masks.global_masks(scores, 0.5)
    np.testing.assert_array_equal(keep["a"], [False, False, False])
    np.testing.assert_array_equal(keep["b"], [True, True, True])


def test_per_layer_scope():
    scores = {"a": np.array([1.0, 2.0]), "b": np.array([30.0, 40.0])}
    keep = masks.layer_masks(scores, 0.5)
    np.testing.assert_array_equal(keep["a"], [False, True])
    np.testing.assert_array_equal(keep["b"], [False, True])


def test_random_criterion_is_seeded():
    w = np.zeros((4, 5))
    a = scoring.random(ScoreContext(w, seed=1, key="dense/kernel"))
    b = scoring.random(ScoreContext(w, seed=1, key="dense/kernel"))
    c = scoring.random(ScoreContext(w, seed=2, key="dense/kernel"))
    d = scoring.random(ScoreContext(w, seed=1, key="dense_1/kernel"))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c) and not np.array_equal(a, d)


def test_unknown_criterion_lists_valid():
    with pytest.raises(ValueError, match=r"unknown criterion 'l3'.*magnitude.*random"):
        scoring.get_criterion("l3")


def test_unknown_scope():
    from prune.core.distributions import get_distribution

    with pytest.raises(ValueError, match=r"unknown scope 'model'; valid: \['layer', 'global', 'erk'\]"):
        get_distribution("model")
    with pytest.raises(ValueError, match="unknown scope 'uniform'"):  # one name per distribution: 'layer'
        get_distribution("uniform")


def test_sparsity_out_of_range():
    with pytest.raises(ValueError, match=r"sparsity must be in \[0, 1\), got 1.0"):
        masks.topk_mask(np.ones(3), 1.0)


def test_validate_mask_shape_and_values():
    with pytest.raises(ValueError, match=r"must have shape \(2, 2\), got shape \(4,\)"):
        masks.validate_mask(np.ones(4), (2, 2))
    with pytest.raises(ValueError, match=r"only 0 and 1, got values \[0.5\]"):
        masks.validate_mask(np.array([[1, 0.5], [0, 1]]), (2, 2))
    assert masks.validate_mask(np.array([[1, 0], [0, 1]]), (2, 2)).dtype == bool
