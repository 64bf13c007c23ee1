"""One-shot methods (magnitude, Wanda, SparseGPT) on host arrays: exact masks on tiny weights, SparseGPT against
the paper's Algorithm 1 written plainly, Wanda against a numpy transcription of the authors' code, and the
reconstruction error on real activations ordered SparseGPT <= Wanda <= magnitude."""

import numpy as np
import pytest

import prune
from prune.algorithms import InputStatistics, Magnitude, SparseGPT, Update, Wanda, algorithms, get_algorithm
from prune.algorithms.oneshot import select_lowest
from prune.algorithms.sparsegpt import inverse_hessian_factor, sparsegpt_prune, sparsegpt_reference


def _stats(x, gram=True):
    st = InputStatistics(x.shape[1], with_gram=gram)
    st.add(x)
    return st


def _update(w, x, gram=True):
    w = np.asarray(w, np.float64)
    return Update("d/kernel", w, np.ones(w.shape, bool), inputs=_stats(np.asarray(x, np.float64), gram), layer="d")


def test_the_registry_has_the_three_oneshot_methods():
    assert algorithms("oneshot") == ["magnitude", "sparsegpt", "wanda"]
    assert get_algorithm("wanda", kind="oneshot") is Wanda
    with pytest.raises(ValueError, match=r"method must be one of \['magnitude', 'sparsegpt', 'wanda'\], got 'gmp'"):
        get_algorithm("gmp", kind="oneshot")


def test_input_statistics_sum_batch_by_batch_and_refuse_bad_batches():
    st = InputStatistics(2, with_gram=True)
    st.add([[1.0, 2.0]])
    st.add(np.array([[3.0, -1.0], [0.0, 1.0]], np.float32))
    assert st.tokens == 3
    np.testing.assert_array_equal(st.sq_norms, [10.0, 6.0])
    np.testing.assert_array_equal(st.gram, [[10.0, -1.0], [-1.0, 6.0]])
    assert st.nbytes == 2 * 8 + 4 * 8
    assert InputStatistics(3).gram is None
    with pytest.raises(ValueError, match=r"inputs must have shape \[tokens, 2\], got \(1, 3\)"):
        st.add([[1.0, 2.0, 3.0]])
    with pytest.raises(ValueError, match="1 NaN or infinite"):
        st.add([[np.nan, 1.0]])
    assert st.tokens == 3  # nothing added by the refused batches
    with pytest.raises(ValueError, match="d_in must be a positive integer, got 0"):
        InputStatistics(0)


def test_input_statistics_of_batches_wider_and_longer_than_a_slab_are_the_whole_sums():
    # add() works a slab of rows and of Gram columns at a time; the sums are the batch's own, to rounding
    rng = np.random.default_rng(7)
    x = rng.standard_normal((700, 300)).astype(np.float32)
    st = _stats(x)
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(st.gram, x64.T @ x64, rtol=1e-12, atol=1e-9)
    np.testing.assert_allclose(st.sq_norms, (x64**2).sum(axis=0), rtol=1e-12)
    assert st.tokens == 700


def test_input_statistics_never_hold_a_float64_copy_of_a_batch_nor_a_gram_sized_temporary():
    import tracemalloc

    x = np.ones((2048, 512), np.float32)  # 4 MB; as float64 8 MB; X^T X is 2 MB
    st = InputStatistics(512, with_gram=True)
    tracemalloc.start()
    st.add(x)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    # a 256-row float64 slab (1 MB) and one 512 x 256 product (0.5 MB) with its sum: about 2 MB; a float64 copy of
    # the batch and a whole X^T X product would be 10 MB
    assert peak < 3 * 2**20, peak
    assert st.gram[0, 0] == 2048.0


def test_select_lowest_counts_per_layer_per_row_and_by_groups_ties_to_the_lower_index():
    s = np.array([[4.0, 1.0], [2.0, 2.0], [3.0, 0.5], [1.0, 5.0]])  # [d_in = 4, d_out = 2]
    # layer: round(0.5 * 8) = 4 lowest over C order: 0.5, 1 (0,1), 1 (3,0), then 2 (1,0) before 2 (1,1)
    np.testing.assert_array_equal(select_lowest(s, 0.5, None, "layer"),
                                  [[True, False], [False, True], [True, False], [False, True]])
    # row (per output): 2 of the 4 inputs of each output
    np.testing.assert_array_equal(select_lowest(s, 0.5, None, "row"),
                                  [[True, False], [False, True], [True, False], [False, True]])
    np.testing.assert_array_equal(select_lowest(s, 0.25, None, "row"),
                                  [[True, True], [True, True], [True, False], [False, True]])
    # 1:2 along the inputs of each output: groups (rows 0-1) and (rows 2-3)
    np.testing.assert_array_equal(select_lowest(s, 0.5, prune.NByM(1, 2), "layer"),
                                  [[True, False], [False, True], [True, False], [False, True]])
    # an entry pruned before stays pruned and counts first
    keep = np.ones(s.shape, bool)
    keep[0, 0] = False
    got = select_lowest(s, 0.25, None, "layer", keep)
    assert not got[0, 0] and (~got).sum() == 2 and not got[2, 1]


def test_magnitude_prunes_the_smallest_and_reads_no_data():
    w = np.array([[0.1, -3.0], [2.0, -0.2], [0.3, 1.0]])
    plan = Magnitude(0.5).plan([Update("d/kernel", w, np.ones(w.shape, bool))])[0]
    np.testing.assert_array_equal(plan.keep, [[False, True], [True, False], [False, True]])
    assert plan.n == 3 and plan.weight is None


def _wanda_authors(w_kernel, x, sparsity=None, prune_n=0, prune_m=0):
    """The authors' prune_wanda (lib/prune.py) in numpy: W as [out, in], scaler_row as their running mean over
    sequences (here one token per sequence), sort each row, prune the first int(in * s)."""
    w = w_kernel.T
    scaler, n = np.zeros(w.shape[1]), 0
    for row in x:  # add_batch, one sequence at a time
        scaler *= n / (n + 1)
        n += 1
        scaler += np.linalg.norm(row[:, None], axis=1) ** 2 / n
    metric = np.abs(w) * np.sqrt(scaler)[None, :]
    mask = np.zeros(w.shape, bool)  # True = pruned
    if prune_n:
        for ii in range(0, w.shape[1], prune_m):
            tmp = metric[:, ii:ii + prune_m]
            np.put_along_axis(mask[:, ii:ii + prune_m], np.argsort(tmp, axis=1, kind="stable")[:, :prune_n], True, axis=1)
    else:
        idx = np.argsort(metric, axis=-1, kind="stable")[:, : int(w.shape[1] * sparsity)]
        np.put_along_axis(mask, idx, True, axis=1)
    return ~mask.T


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_wanda_matches_the_authors_scores_and_masks(seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((40, 16)) * rng.uniform(0.1, 3.0, 16)  # features of very different norms
    w = rng.standard_normal((16, 7))
    u = _update(w, x, gram=False)
    np.testing.assert_allclose(Wanda(0.5).scores(u), np.abs(w) * np.linalg.norm(x, axis=0)[:, None], rtol=1e-12)
    for sparsity in (0.25, 0.5, 0.75):
        np.testing.assert_array_equal(Wanda(sparsity).plan([u])[0].keep, _wanda_authors(w, x, sparsity))
    np.testing.assert_array_equal(Wanda(pattern=prune.NByM(2, 4), sparsity=None).plan([u])[0].keep,
                                  _wanda_authors(w, x, prune_n=2, prune_m=4))
    np.testing.assert_array_equal(Wanda(pattern=prune.NByM(4, 8), sparsity=None).plan([u])[0].keep,
                                  _wanda_authors(w, x, prune_n=4, prune_m=8))


CASES = [  # (d_in, d_out, pattern, scope, blocksize)
    (37, 13, None, "layer", 8),
    (37, 13, None, "row", 16),
    (64, 9, None, "layer", 128),
    (40, 11, prune.NByM(2, 4), "layer", 8),
    (48, 5, prune.NByM(4, 8), "layer", 16),
    (30, 6, prune.NByM(2, 4), "layer", 12),  # d_in not a multiple of 4: a last group of 2 keeps 2
]


@pytest.mark.parametrize("d_in,d_out,pattern,scope,blocksize", CASES)
def test_sparsegpt_equals_algorithm_1_written_plainly(d_in, d_out, pattern, scope, blocksize):
    rng = np.random.default_rng(d_in + d_out)
    x = rng.standard_normal((300, d_in)) @ rng.standard_normal((d_in, d_in))
    x[:, 3] = 0.0  # an input never seen: its weights go to 0
    w = rng.standard_normal((d_in, d_out))
    gram = x.T @ x
    keep, new = sparsegpt_prune(w, gram, 0.6, pattern, scope, blocksize)
    ref_keep, ref_new = sparsegpt_reference(w, gram, 0.6, pattern, scope, blocksize)
    np.testing.assert_array_equal(keep, ref_keep)
    np.testing.assert_allclose(new, ref_new, rtol=1e-5, atol=1e-5 * np.abs(ref_new).max())
    assert np.all(new[~keep] == 0.0) and np.all(new[3] == 0.0)
    if pattern is None and scope == "layer":
        assert (~keep).sum() == round(0.6 * d_in * d_out)
    elif pattern is None:
        assert np.all((~keep).sum(axis=0) == round(0.6 * d_in))
    else:
        groups = np.pad(~keep, ((0, -d_in % pattern.n), (0, 0))).reshape(-1, pattern.n, d_out)
        full = d_in // pattern.n
        assert np.all(groups[:full].sum(axis=1) == pattern.m)
        if d_in % pattern.n:
            assert np.all(groups[full].sum(axis=0) == max(d_in % pattern.n - (pattern.n - pattern.m), 0))
    # the update helps: a lower reconstruction error than the same mask without it
    assert np.linalg.norm(x @ (w - new)) < np.linalg.norm(x @ (w - w * keep))


def test_sparsegpt_inverse_factor_is_the_upper_cholesky_of_the_damped_inverse():
    gram = np.array([[4.0, 2.0, 0.0], [2.0, 3.0, 0.0], [0.0, 0.0, 0.0]])
    u, dead = inverse_hessian_factor(gram, 0.1)
    h = np.array([[4.0, 2.0, 0.0], [2.0, 3.0, 0.0], [0.0, 0.0, 1.0]]) + 0.1 * (8.0 / 3.0) * np.eye(3)
    np.testing.assert_allclose(u.T @ u, np.linalg.inv(h), rtol=1e-12)
    assert np.array_equal(u, np.triu(u)) and dead.tolist() == [False, False, True]


@pytest.mark.parametrize("d", [1, 127, 128, 129, 300])
def test_sparsegpt_inverse_factor_matches_cholesky_of_the_inverse_across_block_edges(d):
    rng = np.random.default_rng(d)
    x = rng.standard_normal((2 * d + 3, d))
    gram = x.T @ x
    u, dead = inverse_hessian_factor(gram, 0.01)
    ref = np.linalg.cholesky(np.linalg.inv(gram + 0.01 * np.mean(np.diag(gram)) * np.eye(d))).T
    np.testing.assert_allclose(u, ref, rtol=0, atol=1e-12 * np.abs(ref).max())
    assert np.array_equal(u, np.triu(u)) and not dead.any()


def test_oneshot_methods_refuse_bad_arguments_naming_them():
    with pytest.raises(ValueError, match=r"sparsity must be a number in \[0, 1\), got 1.0"):
        Wanda(1.0)
    with pytest.raises(ValueError, match=r"sparsity must be a number in \[0, 1\), got -0.1"):
        Magnitude(-0.1)
    with pytest.raises(ValueError, match=r"sparsity must be None or 0.5 \(m / n\)"):
        SparseGPT(0.7, pattern=prune.NByM(2, 4))
    with pytest.raises(ValueError, match=r"pattern must be None, prune.Unstructured\(\) or prune.NByM"):
        Wanda(0.5, pattern=prune.Block((1, 4)))
    with pytest.raises(ValueError, match=r"scope must be one of \['layer', 'row'\] for one-shot pruning, got 'global'"):
        Wanda(0.5, scope="global")
    with pytest.raises(ValueError, match="blocksize must be a multiple of the N:M group length 8, got 12"):
        SparseGPT(pattern=prune.NByM(4, 8), sparsity=None, blocksize=12)
    with pytest.raises(ValueError, match=r"percdamp must be a number in \(0, 1\], got 0"):
        SparseGPT(0.5, percdamp=0)
    u = Update("d/kernel", np.ones((3, 2)), np.ones((3, 2), bool))
    with pytest.raises(ValueError, match="method 'wanda' needs the inputs of 'd/kernel' on calibration data"):
        Wanda(0.5).plan([u])
    bad = _update(np.ones((3, 2)), np.ones((4, 2)), gram=False)
    with pytest.raises(ValueError, match="weight 'd/kernel' has 3 inputs, its statistics 2"):
        Wanda(0.5).plan([bad])


def test_reconstruction_error_on_real_activations_orders_sparsegpt_wanda_magnitude():
    """Layer-wise ||XW - XW'||^2 on a trained MLP's real inputs and hidden activations (scikit-learn's digits)."""
    import keras

    from sklearn.datasets import load_digits

    x_train, y_train = load_digits(return_X_y=True)
    x_train = (x_train / 16.0).astype("float32")
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(48, activation="relu"), keras.layers.Dense(10)])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x_train, y_train, epochs=20, batch_size=64, verbose=0)
    hidden = np.asarray(model.layers[0](x_train))
    for x, layer in ((x_train, model.layers[0]), (hidden, model.layers[1])):
        x = np.asarray(x, np.float64)
        w = np.asarray(layer.kernel, np.float64)
        u = _update(w, x)
        for kwargs in ({"sparsity": 0.5}, {"sparsity": None, "pattern": prune.NByM(2, 4)}):
            errors = {}
            for cls in (SparseGPT, Wanda, Magnitude):
                plan = cls(**kwargs).plan([u])[0]
                new = w * plan.keep if plan.weight is None else plan.weight
                errors[cls.name] = float(np.linalg.norm(x @ w - x @ new) ** 2)
            assert errors["sparsegpt"] <= errors["wanda"] <= errors["magnitude"], (kwargs, errors)
