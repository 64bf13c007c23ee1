"""Native sparse kernels: agreement with a dense reference, proof they ran, build cache and fallback paths."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from prune import native
from prune.layers import kernels
from prune.layers.sparse import SparseDense

ROOT = Path(__file__).resolve().parents[3]
FORCED_OFF = os.environ.get("PRUNE_NATIVE", "1").strip() == "0"
needs_native = pytest.mark.skipif(FORCED_OFF, reason="PRUNE_NATIVE=0 forces the fallback")


def _problem(n_in, n_out, batch, sparsity, seed, zero_row=False, zero_col=False):
    rng = np.random.default_rng(seed)
    mask = rng.random((n_in, n_out)) >= sparsity
    if zero_row:
        mask[n_in // 2] = False
    if zero_col:
        mask[:, n_out // 2] = False
    w = (rng.standard_normal((n_in, n_out)) * mask).astype(np.float32)
    x = rng.standard_normal((batch, n_in)).astype(np.float32)
    dy = rng.standard_normal((batch, n_out)).astype(np.float32)
    return mask, w, x, dy


def _native_ops(fn, *args):
    graph = fn.get_concrete_function(*args).graph
    ops = {op.type for op in graph.get_operations()}
    for f in graph._functions.values():  # gradient and switch branches live in nested functions
        ops |= {node.op for node in f.definition.node_def}
    return {op for op in ops if op.startswith("Prune")}


# (n_in, n_out, batch, sparsity, empty row, empty column)
SHAPES = [
    (1, 1, 1, 0.0, False, False),
    (1, 1, 3, 1.0, False, False),  # nnz 0
    (7, 3, 17, 0.5, True, True),
    (3, 11, 3, 0.3, True, False),
    (33, 20, 256, 0.9, True, True),
    (20, 45, 1, 0.8, False, True),
    (64, 16, 17, 0.0, False, False),
    (40, 40, 256, 1.0, False, False),  # nnz 0, full tiles
    # batch below one vector: forward scatters along W's rows, input gradient gathers (AVX2: 16 entries a
    # vector pass at batch 1); cut into units of 32k multiply-adds that the threads take in turn (at most 16)
    (600, 400, 1, 0.2, True, True),  # 5 units
    (300, 200, 3, 0.3, True, False),  # 3 units
    (400, 600, 7, 0.5, False, True),  # 16 units
    (100, 200, 1, 0.3, False, False),  # 14k multiply-adds: one unit, on the calling thread
    (90, 70, 100, 0.2, True, True),  # 4 batch tiles: values gathered into W^T order once, then the tiles
    (300, 40, 40, 0.3, True, True),  # one forward tile larger than L1, values read through tperm
    (300, 40, 100, 0.3, False, True),  # the same after the value gather
    (50, 30, 12, 0.4, True, False),  # 16-lane builds: a batch of 8..15 runs as 8 rows, then the rest
    (70, 50, 300, 0.6, False, True),  # more tiles than threads at every vector width: the value gather
]


@needs_native
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "tf.function"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s[:3])) + f"-s{s[3]}")
def test_native_matches_dense_reference(shape, compiled):
    n_in, n_out, batch, sparsity, zero_row, zero_col = shape
    mask, w, x, dy = _problem(n_in, n_out, batch, sparsity, seed=n_in * 7 + batch, zero_row=zero_row, zero_col=zero_col)
    idx = np.argwhere(mask).astype(np.int64)
    structure = native.structure(idx, n_in, n_out)

    def run(x, values):
        with tf.GradientTape() as tape:
            tape.watch([x, values])
            # values_grad="sampled" is the native sampled product (auto takes xᵀ·dy when every entry is stored)
            y = kernels.sparse_matmul(
                x, values, idx, (n_in, n_out), matmul="native", structure=structure, values_grad="sampled"
            )
        return (y, *tape.gradient(y, [x, values], output_gradients=tf.constant(dy)))

    fn = tf.function(run) if compiled else run
    y, gx, gv = (t.numpy() for t in fn(tf.constant(x), tf.constant(w[mask])))
    x64, w64, dy64 = x.astype(np.float64), w.astype(np.float64), dy.astype(np.float64)
    for got, want in ((y, x64 @ w64), (gx, dy64 @ w64.T), (gv, (x64.T @ dy64)[mask])):
        assert got.shape == want.shape
        scale = max(np.abs(want).max(initial=0.0), 1e-30)
        assert np.abs(got - want).max(initial=0.0) <= 1e-5 * scale
    if compiled:
        assert _native_ops(fn, tf.constant(x), tf.constant(w[mask])) == {"PruneSpmm", "PruneSddmm"}


@needs_native
def test_native_path_is_the_one_exercised():
    """The library was built or loaded (not the fallback), and a SparseDense graph runs its ops forward and backward."""
    st = native.status()
    assert st.available, st.reason
    assert Path(st.path).is_file() and Path(st.path).parent == native.cache_dir()
    layer = SparseDense(16, sparsity=0.8, matmul="native")
    layer.build((None, 32))
    x = tf.constant(np.random.default_rng(0).standard_normal((5, 32)).astype(np.float32))

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(layer(x) ** 2)
        return tape.gradient(loss, [layer.values])

    step(x)
    assert _native_ops(step, x) == {"PruneSpmm", "PruneSddmm"}
    forward = step.get_concrete_function(x).graph
    spmm = [op for op in forward.get_operations() if op.type == "PruneSpmm"]
    assert sorted(op.get_attr("transpose") for op in spmm) == [False, True]  # forward and input gradient


def _lanes() -> int:
    """Floats per vector in the loaded library (its status: ``"avx512 (16 lanes)"``)."""
    return int(native.status().vector.split("(")[1].split()[0])


@needs_native
def test_native_op_rejects_a_corrupt_structure():
    lib = native.load()
    tiled = _lanes() + 1  # the smallest batch that goes through the tiles
    idx = np.array([[0, 0], [1, 1]], np.int64)
    good = native.structure(idx, 2, 2)
    lib.prune_spmm(np.ones((tiled, 2), np.float32), np.ones(2, np.float32), good, n_in=2, n_out=2)
    bad = good.copy()
    bad[3] = 7  # a column of W beyond n_out
    for batch in (1, tiled):
        with pytest.raises(tf.errors.InvalidArgumentError, match="out-of-range"):
            lib.prune_spmm(np.ones((batch, 2), np.float32), np.ones(2, np.float32), bad, n_in=2, n_out=2, transpose=True)
    with pytest.raises(tf.errors.InvalidArgumentError, match="out-of-range"):  # forward at batch 1 scatters along W
        lib.prune_spmm(np.ones((1, 2), np.float32), np.ones(2, np.float32), bad, n_in=2, n_out=2)
    bad_t = good.copy()
    bad_t[8] = 7  # a column of W^T (tcols, after rp, cols and trp) beyond n_in
    for batch in (tiled, 300):  # forward tiles along W^T: one tile reading through tperm; tperm gathered first
        with pytest.raises(tf.errors.InvalidArgumentError, match="out-of-range"):
            lib.prune_spmm(np.ones((batch, 2), np.float32), np.ones(2, np.float32), bad_t, n_in=2, n_out=2)
    bad_perm = good.copy()
    bad_perm[-1] = 2  # a position beyond nnz in tperm, the last part of the structure
    for batch in (tiled, 300):
        with pytest.raises(tf.errors.InvalidArgumentError, match="out-of-range"):
            lib.prune_spmm(np.ones((batch, 2), np.float32), np.ones(2, np.float32), bad_perm, n_in=2, n_out=2)
    # one W^T row of 300; without the panel section, which the forward's batch-300 path would read instead of
    # W^T's columns (its own corruptions: test_native_panels.py)
    long = native.structure(np.stack([np.arange(300), np.zeros(300, int)], 1), 300, 1, panels=False)
    long[300 + 1 + 300 + 2 + 150] = 300  # a column of W^T beyond n_in, in the middle of a long row
    for batch in (tiled, 300):
        with pytest.raises(tf.errors.InvalidArgumentError, match="out-of-range"):
            lib.prune_spmm(np.ones((batch, 300), np.float32), np.ones(300, np.float32), long, n_in=300, n_out=1)
    # one W row of 300 entries at every other column (no 1 x C tiles, so no block section)
    wide = native.structure(np.stack([np.zeros(300, int), 2 * np.arange(300)], 1), 1, 600)
    assert wide.size == 3 * 300 + 1 + 600 + 2
    wide[1 + 1 + 150] = 600  # a column of W beyond n_out, inside a group of 8 the scatter checks as one vector
    for batch in (1, 3):  # the forward scatter along W (batch 1 and a small batch), checking as it reads
        with pytest.raises(tf.errors.InvalidArgumentError, match="out-of-range"):
            lib.prune_spmm(np.ones((batch, 1), np.float32), np.ones(300, np.float32), wide, n_in=1, n_out=600)
    negative = good.copy()
    negative[3] = -1  # checked as unsigned: a negative column is out of range too
    for batch, transpose in ((1, False), (1, True), (tiled, True)):  # the paths that read W's rows
        with pytest.raises(tf.errors.InvalidArgumentError, match="out-of-range"):
            lib.prune_spmm(np.ones((batch, 2), np.float32), np.ones(2, np.float32), negative, n_in=2, n_out=2,
                           transpose=transpose)
    for batch in (1, tiled):  # the values gradient walks W's rows
        with pytest.raises(tf.errors.InvalidArgumentError, match="out-of-range"):
            lib.prune_sddmm(np.ones((batch, 2), np.float32), np.ones((batch, 2), np.float32), np.ones(2, np.float32),
                            bad, n_in=2, n_out=2)
    with pytest.raises(tf.errors.InvalidArgumentError, match="out-of-range"):  # batch 1's row gather (profile 5)
        lib.prune_spmm(np.ones((1, 2), np.float32), np.ones(2, np.float32), bad_perm, n_in=2, n_out=2, profile=5)
    with pytest.raises(tf.errors.InvalidArgumentError, match="structure must have"):
        lib.prune_spmm(np.ones((1, 2), np.float32), np.ones(3, np.float32), good, n_in=2, n_out=2)


_SMALL_BATCH_BITS = """
import sys
import numpy as np
import tensorflow as tf
tf.config.threading.set_intra_op_parallelism_threads(int(sys.argv[1]))
from prune import native
lib = native.load()
rng = np.random.default_rng(5)
mask = rng.random((700, 300)) >= 0.5
idx = np.argwhere(mask).astype(np.int64)
structure = native.structure(idx, 700, 300)
values = rng.standard_normal(len(idx)).astype(np.float32)
out = {}
for batch in (1, 3, 7):
    x = rng.standard_normal((batch, 700)).astype(np.float32)
    dy = rng.standard_normal((batch, 300)).astype(np.float32)
    runs = [lib.prune_spmm(x, values, structure, n_in=700, n_out=300).numpy() for _ in range(20)]
    assert all(np.array_equal(r, runs[0]) for r in runs), f"batch {batch}: the forward differs between calls"
    out[f"y{batch}"] = runs[0]
    out[f"dx{batch}"] = lib.prune_spmm(dy, values, structure, n_in=700, n_out=300, transpose=True).numpy()
np.savez(sys.argv[2], **out)
"""


@needs_native
def test_small_batch_results_are_bitwise_the_same_on_any_number_of_threads(tmp_path):
    # Below one vector of batch rows the work is cut into units that whichever threads are awake take in turn
    # (sparse_ops.cc: Shared); the forward's per-unit partial outputs must add up in unit order, whoever ran them.
    # 105k-735k multiply-adds: 3 to 16 units. Each interpreter also repeats the forward 20 times.
    bits = {}
    for threads in (1, 2, 3):
        out = tmp_path / f"t{threads}.npz"
        proc = subprocess.run([sys.executable, "-c", _SMALL_BATCH_BITS, str(threads), str(out)], capture_output=True,
                              text=True, timeout=300, cwd=str(ROOT))
        assert proc.returncode == 0, proc.stderr[-2000:]
        bits[threads] = dict(np.load(out))
    for threads in (2, 3):
        for name, got in bits[threads].items():
            assert np.array_equal(got.view(np.uint32), bits[1][name].view(np.uint32)), (threads, name)


def test_auto_and_native_layers_match_dense_layer_in_this_mode():
    # Whatever mode the suite runs in (native or PRUNE_NATIVE=0), "native" and "auto" compute x @ W + b.
    rng = np.random.default_rng(3)
    w = rng.standard_normal((12, 9)).astype(np.float32)
    mask = rng.random((12, 9)) > 0.7
    x = rng.standard_normal((4, 12)).astype(np.float32)
    for matmul in ("native", "auto"):
        layer = SparseDense.from_dense(w, mask, matmul=matmul)
        np.testing.assert_allclose(layer(x).numpy(), x @ (w * mask), rtol=1e-5, atol=1e-6)


CHILD = textwrap.dedent(
    """
    import json, sys, warnings
    import os
    import prune
    from prune import native
    imported_clean = native._state == {}  # import prune neither built nor loaded anything
    if os.environ.get("CHILD_FIRST_MARCH"):  # the machine's own flags fail to build: the retry must take over
        native.target_flags = lambda cxx, march="native": [f"-march={os.environ['CHILD_FIRST_MARCH']}"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import numpy as np
        from prune.layers.sparse import SparseDense
        layer = SparseDense.from_dense(np.eye(3, dtype="float32"), np.eye(3), matmul="native")
        y = layer(np.arange(6, dtype="float32").reshape(2, 3)).numpy()
        layer(y)  # a second call: still one warning
    st = native.status()
    attempts = len(native.build_attempts(native._compiler() or "c++"))
    print(json.dumps(dict(imported_clean=imported_clean, available=st.available, reason=st.reason, built=st.built,
                          attempts=attempts, flags=st.flags, vector=st.vector,
                          y=y.tolist(), warnings=[str(w.message) for w in caught if "native" in str(w.message)])))
    """
)


def _child(env_updates: dict, cache: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in ("PRUNE_NATIVE", "CXX")}
    env.update(PYTHONPATH=str(ROOT), PRUNE_NATIVE_CACHE=str(cache), TF_CPP_MIN_LOG_LEVEL="3", **env_updates)
    return subprocess.Popen([sys.executable, "-c", CHILD], env=env, cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _result(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def test_fresh_build_by_concurrent_processes_and_every_fallback(tmp_path):
    """Two processes on an empty cache build once and both load; PRUNE_NATIVE=0 and a failing compiler fall back."""
    fresh, off, broken, retry = tmp_path / "fresh", tmp_path / "off", tmp_path / "broken", tmp_path / "retry"
    procs = [_child({"PRUNE_NATIVE": "1"}, fresh), _child({"PRUNE_NATIVE": "1"}, fresh),
             _child({"PRUNE_NATIVE": "0"}, off), _child({"PRUNE_NATIVE": "1", "CXX": "/bin/false"}, broken)]
    # The failure, made to happen on any x86-64 CPU with AVX2: -march=sapphirerapids without the
    # AVX512-FP16 exclusion fails inside TensorFlow's Eigen headers; the AVX2+FMA retry then builds.
    cpu = set(native._cpu_isa().split())
    can_retry = native._machine() == "x86_64" and {"avx2", "fma"} <= cpu and subprocess.run(
        ["g++", "-march=sapphirerapids", "-E", "-x", "c++", os.devnull], capture_output=True).returncode == 0
    if can_retry:
        procs.append(_child({"PRUNE_NATIVE": "1", "CHILD_FIRST_MARCH": "sapphirerapids"}, retry))
    first, second, forced, failed, *retried = (_result(p) for p in procs)
    want = [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    for res in (first, second, forced, failed):
        assert res["imported_clean"]
        assert res["y"] == want
    # One process compiled, the other waited on the lock and loaded the same file.
    assert first["available"] and second["available"], (first, second)
    assert sorted([first["built"], second["built"]]) == [False, True]
    assert first["warnings"] == second["warnings"] == []
    assert first["flags"] == second["flags"] and first["vector"] == second["vector"] != ""
    if native._machine() in ("x86_64", "aarch64"):
        assert first["flags"].startswith("-march=native"), first["flags"]
    assert len(list(fresh.glob("*.so"))) == 1 and not list(fresh.glob("*.tmp*"))
    # Forced fallback: said once, with the reason.
    assert not forced["available"] and forced["reason"] == "PRUNE_NATIVE=0"
    assert len(forced["warnings"]) == 1 and "PRUNE_NATIVE=0" in forced["warnings"][0]
    assert not off.exists()  # nothing built
    # Failing compiler: said once, the reason names each failed attempt (the machine's flags, then the
    # conservative set), one log is kept per attempt and no library appears.
    assert not failed["available"] and failed["reason"].count("build failed") == failed["attempts"], failed
    assert len(failed["warnings"]) == 1
    assert len(list(broken.glob("*.failed"))) == failed["attempts"] >= 1 and not list(broken.glob("*.so"))
    if retried:  # one failed attempt kept with its log, then the conservative build, loaded and right
        (res,) = retried
        assert res["available"] and res["flags"] == "-mavx2 -mfma" and res["vector"] == "avx2+fma (8 lanes)", res
        assert res["warnings"] == [] and res["y"] == want
        (log,) = retry.glob("*.failed")
        assert "PacketMathFP16.h" in log.read_text() and len(list(retry.glob("*.so"))) == 1


@needs_native
def test_import_prune_loads_a_library_already_built_and_never_compiles(tmp_path):
    """With the library in the cache, ``import prune`` registers the ops once TensorFlow is imported (a saved graph
    holding them loads); with an empty cache it compiles nothing."""
    assert native.load() is not None  # built (or loaded) into this session's cache
    code = ("import json, prune, tensorflow; from prune import native; st = native._state.get('status'); "
            "print(json.dumps(dict(loaded=st is not None and st.available, built=st is not None and st.built)))")
    results = {}
    for name, cache in (("built", native.cache_dir()), ("empty", tmp_path / "empty")):
        env = {k: v for k, v in os.environ.items() if k not in ("PRUNE_NATIVE", "CXX")}
        env.update(PYTHONPATH=str(ROOT), PRUNE_NATIVE_CACHE=str(cache), TF_CPP_MIN_LOG_LEVEL="3")
        proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        results[name] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert results["built"]["loaded"] and not results["built"]["built"]
    assert not results["empty"]["loaded"] and not (tmp_path / "empty").exists()  # nothing compiled, nothing written


@needs_native
def test_load_before_tensorflow_is_imported_does_not_deadlock():
    # native.load() imports TensorFlow; that import runs prune's post-import hook (prune/_lazy.py), which calls
    # native.load_if_built() -> native.load() again. With the library in the cache and the load lock held across
    # the import, the process hung for good (found 2026-12-02). A fresh interpreter that has imported neither.
    assert native.load() is not None  # the library for this machine is in the cache now
    code = "import numpy\nfrom prune import native\nimport sys\nassert 'tensorflow' not in sys.modules\n" \
           "print(native.load() is not None, native.status().reason)\n"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=str(Path(__file__).resolve().parents[3]))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split()[0] == "True", proc.stdout
