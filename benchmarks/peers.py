"""SparseDense against what a user would pick instead: TF dense, scipy.sparse CSR, torch.sparse CSR.

For each size, batch and sparsity (uniformly random structure), times the
forward product ``y = x @ W`` (+ bias for the two Keras layers):

    dense     keras.layers.Dense, in a compiled graph (oneDNN's GEMM)
    native    prune.layers.SparseDense(matmul="native"), in a compiled graph
    scipy     scipy.sparse CSR of W^T times x^T, one thread (scipy's sparse products are
              single-threaded): ``(wt @ x.T).T``, the layer's contract (x [batch, n_in]
              row-major in, y [batch, n_out] out; the final .T is a view, and scipy copies
              x.T into row order itself, as the native op transposes its tiles)
    torch     torch.sparse_csr_tensor (int32 indices) of W^T times x^T (``wt @ x.t()``),
              torch.mv at batch 1 (MKL's sparse BLAS in the CPU wheels), torch.set_num_threads(threads);
              its OpenMP threads spin while waiting unless OMP_WAIT_POLICY=PASSIVE is set (the
              header records it): on a loaded machine spinning cost torch 10-100x here

The TensorFlow layers are timed per application inside a graph, as in a real
model: ``(T_K - T_1) / (K - 1)`` for a ``tf.function`` applying the layer to
``K`` distinct inputs against one applying it once, so the ~0.3 ms fixed cost
of calling a function is not in it (as ``benchmarks/layer_speed.py``'s
``forward_graph``). scipy and torch are timed per call in a Python loop (the
loop adds ~1 us). Each measurement repeats its calls for at least
``--min-ms``; the median over ``--rounds`` interleaved rounds (shuffled order
within each round) is kept.

torch is not a dependency of prune: it runs in a child process of another
interpreter (``--torch-python``, default ``$PRUNE_TORCH_PYTHON``, else
``/work/.venv-torch/bin/python`` when present) that the parent feeds the same
matrices and asks for timings within the same rounds. Without torch the column
is empty and the report says why.

    .venv/bin/python benchmarks/peers.py                          # 1024^2 and 4096^2, batches 1/32/256
    .venv/bin/python benchmarks/peers.py --sizes 1024 --sparsities 0.9,0.99
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SPARSITIES = (0.5, 0.8, 0.9, 0.95, 0.99)
BATCHES = (1, 32, 256)
DEFAULT_TORCH = Path("/work/.venv-torch/bin/python")

# The torch child: reads one JSON command per line, answers one JSON line.
TORCH_WORKER = r"""
import json, sys, time
import numpy as np
try:
    import torch
except Exception as err:  # not importable: say so once and stop
    print(json.dumps({"error": f"{type(err).__name__}: {err}"}), flush=True)
    sys.exit(0)
threads = int(sys.argv[1])
torch.set_num_threads(threads)
print(json.dumps({"version": torch.__version__, "threads": torch.get_num_threads(),
                  "mkl": bool(torch.backends.mkl.is_available())}), flush=True)
for line in sys.stdin:
    cmd = json.loads(line)
    if cmd["op"] == "load":
        d = np.load(cmd["path"])
        # int32 indices: the MKL path (int64 measured 1.5-3x slower)
        wt = torch.sparse_csr_tensor(torch.from_numpy(d["indptr"]).int(), torch.from_numpy(d["indices"]).int(),
                                     torch.from_numpy(d["data"]), size=tuple(d["shape"]))
        x = torch.from_numpy(d["x"])  # [batch, n_in], row-major as the layer's input
        if x.shape[0] == 1:  # batch 1: the matrix-vector product (torch.mv), faster than a 1-column matmul
            v = x[0]
            fn = lambda: torch.mv(wt, v)
        else:
            fn = lambda: wt @ x.t()  # y^T; y = its .t(), a view
        with torch.no_grad():
            y = fn().reshape(wt.shape[0], -1)
        np.save(cmd["check"], y.numpy())
        print(json.dumps({"ok": True}), flush=True)
    elif cmd["op"] == "time":
        min_s = cmd["min_ms"] / 1e3
        with torch.no_grad():
            n, t0 = 0, time.perf_counter()
            while True:
                fn()
                n += 1
                t = time.perf_counter() - t0
                if t >= min_s:
                    break
        print(json.dumps({"ms": t * 1e3 / n}), flush=True)
"""


class TorchPeer:
    """The torch child process, or the reason it is not there (``self.note``)."""

    def __init__(self, python: str | None, threads: int) -> None:
        self.proc, self.note, self.info = None, "", {}
        if not python or not Path(python).exists():
            self.note = f"torch not measured: no interpreter with torch ({python or 'none given'}; --torch-python)"
            return
        self.proc = subprocess.Popen([python, "-c", TORCH_WORKER, str(threads)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        first = json.loads(self.proc.stdout.readline() or '{"error": "the child exited"}')
        if "error" in first:
            self.note = f"torch not measured: torch is not importable by {python} ({first['error']})"
            self.proc = None
        else:
            self.info = first

    def ask(self, **cmd) -> dict:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        if self.proc is not None:
            self.proc.stdin.close()
            self.proc.wait(timeout=60)


def random_mask(rng: np.random.Generator, n_in: int, n_out: int, sparsity: float) -> np.ndarray:
    n = n_in * n_out
    mask = np.zeros(n, bool)
    mask[rng.permutation(n)[: n - int(round(sparsity * n))]] = True
    return mask.reshape(n_in, n_out)


def graph_fns(layer, xs):
    """A one-application and a ``len(xs)``-application forward function of ``layer``."""
    import tensorflow as tf

    one = tf.function(lambda: tf.reduce_sum(layer(xs[0])))
    k = tf.function(lambda: tf.add_n([tf.reduce_sum(layer(x)) for x in xs]))
    return one, k


def time_calls(fn, min_ms: float) -> float:
    """Mean time of one call of ``fn`` (ms), calling it repeatedly for at least ``min_ms``."""
    n, t0 = 0, time.perf_counter()
    while True:
        fn()
        n += 1
        t = time.perf_counter() - t0
        if t * 1e3 >= min_ms:
            return t * 1e3 / n


def measure_point(size, batch, sparsity, rounds, graph_k, min_ms, torch_peer, rng, workdir, layers):
    """Median ms per application of each implementation at one point; ``layers`` maps name -> layer factory."""
    import scipy.sparse as sp
    import tensorflow as tf

    n_in = n_out = size
    w = (rng.standard_normal((n_in, n_out)) * np.sqrt(2.0 / n_in)).astype(np.float32)
    xs_np = [rng.standard_normal((batch, n_in)).astype(np.float32) for _ in range(graph_k)]
    xs = [tf.constant(x) for x in xs_np]
    fns: dict[str, object] = {}
    checks = {}
    for name, factory in layers.items():
        layer, mask = factory(w, rng, sparsity)
        one, k = graph_fns(layer, xs)
        checks[name] = (float(one().numpy()), mask)
        k().numpy()
        fns[name + "/1"] = lambda one=one: one().numpy()
        fns[name + "/k"] = lambda k=k: k().numpy()
    mask = checks["native"][1] if "native" in checks else random_mask(rng, n_in, n_out, sparsity)
    wt = sp.csr_matrix((w * mask).T)  # rows = outputs
    x0 = xs_np[0]
    fns["scipy"] = (lambda: wt @ x0[0]) if batch == 1 else (lambda: (wt @ x0.T).T)
    ref = (x0 @ (w * mask)).T
    np.testing.assert_allclose((wt @ x0.T), ref, rtol=1e-3, atol=1e-3)
    if torch_peer.proc is not None:
        path, check = workdir / "w.npz", workdir / "y.npy"
        np.savez(path, indptr=wt.indptr, indices=wt.indices, data=wt.data.astype(np.float32),
                 shape=np.array(wt.shape), x=x0)
        torch_peer.ask(op="load", path=str(path), check=str(check))
        np.testing.assert_allclose(np.load(check), ref, rtol=1e-3, atol=1e-3)
        fns["torch"] = None  # timed in the child
    times = {k: [] for k in fns}
    keys = list(fns)
    for _ in range(rounds):
        rng.shuffle(keys)
        for key in keys:
            if key == "torch":
                times[key].append(torch_peer.ask(op="time", min_ms=min_ms)["ms"])
            else:
                times[key].append(time_calls(fns[key], min_ms))
    med = {k: float(np.median(v)) for k, v in times.items()}
    out = {}
    for name in layers:
        out[name] = (med[name + "/k"] - med[name + "/1"]) / (graph_k - 1)
    out["scipy"] = med["scipy"]
    if "torch" in med:
        out["torch"] = med["torch"]
    return out, int(mask.sum())


def tf_layers(names: tuple[str, ...]) -> dict:
    """Factories ``(w, rng, sparsity) -> (built layer, mask)`` for the TensorFlow implementations."""
    import keras

    from prune.layers.sparse import SparseDense

    def dense(w, rng, sparsity):
        mask = random_mask(rng, *w.shape, sparsity)
        layer = keras.layers.Dense(w.shape[1])
        layer.build((None, w.shape[0]))
        layer.kernel.assign(w * mask)
        return layer, mask

    def native(w, rng, sparsity):
        mask = random_mask(rng, *w.shape, sparsity)
        return SparseDense.from_dense(w, mask, matmul="native"), mask

    table = {"dense": dense, "native": native}
    return {n: table[n] for n in names}


def machine() -> str:
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cpus"


def markdown(df: pd.DataFrame, header: list[str]) -> str:
    impls = [c for c in ("dense", "native", "scipy", "torch") if c in df.columns]
    lines = ["# SparseDense against its peers", "", *header, "",
             "Milliseconds per application (median); **bold** = fastest; `x_peer` = time of the faster of scipy "
             "and torch over `native`'s (>= 1: native at least as fast).", ""]
    lines.append("| size | batch | sparsity | " + " | ".join(impls) + " | x_dense | x_peer |")
    lines.append("|---|---|---|" + "---|" * (len(impls) + 2))
    for _, row in df.iterrows():
        best = min(row[c] for c in impls if pd.notna(row[c]))
        cells = [f"**{row[c]:.3f}**" if row[c] == best else f"{row[c]:.3f}" if pd.notna(row[c]) else "-"
                 for c in impls]
        peers = [row[c] for c in ("scipy", "torch") if c in df.columns and pd.notna(row[c])]
        ratios = (f"{row['dense'] / row['native']:.2f} | {min(peers) / row['native']:.2f}" if "native" in df.columns
                  else "- | -")  # without the native library (PRUNE_NATIVE=0) only the peers are timed
        lines.append(f"| {int(row['size'])}² | {int(row['batch'])} | {row['sparsity']:.0%} | " + " | ".join(cells)
                     + f" | {ratios} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1024,4096")
    parser.add_argument("--batches", default=",".join(map(str, BATCHES)))
    parser.add_argument("--sparsities", default=",".join(map(str, SPARSITIES)))
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--graph-k", type=int, default=16)
    parser.add_argument("--min-ms", type=float, default=20.0, help="each measurement repeats calls for this long")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--torch-python", default=os.environ.get("PRUNE_TORCH_PYTHON") or str(DEFAULT_TORCH))
    parser.add_argument("--out", default=str(ROOT / "results" / "benchmarks" / "peers.csv"))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    import scipy
    import tensorflow as tf

    import prune  # noqa: F401  (sets the oneDNN switches before any graph is built)
    from prune import native

    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    st = native.status()
    torch_peer = TorchPeer(args.torch_python, args.threads)
    torch_line = (f"torch {torch_peer.info['version']} (MKL {torch_peer.info['mkl']}), "
                  f"torch.set_num_threads({torch_peer.info['threads']}), "
                  f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}" if torch_peer.proc else torch_peer.note)
    header = [
        f"Machine: {machine()}; native kernels: {st.vector or st.reason} (flags `{st.flags}`).",
        f"TensorFlow {tf.__version__}: intra_op_threads={tf.config.threading.get_intra_op_parallelism_threads()}, "
        f"inter_op_threads={tf.config.threading.get_inter_op_parallelism_threads()}, in-graph time per application "
        f"((T_{args.graph_k} - T_1) / {args.graph_k - 1}); scipy {scipy.__version__} (single-threaded); {torch_line}.",
        f"Medians of {args.rounds} interleaved rounds, each measurement >= {args.min_ms:g} ms of calls; load average "
        f"at the start {open('/proc/loadavg').read().split()[0]}, at the end: see below.",
    ]
    print("\n".join(header), flush=True)
    rng = np.random.default_rng(args.seed)
    layers = tf_layers(("dense", "native") if st.available else ("dense",))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        try:
            for size in (int(s) for s in args.sizes.split(",")):
                for batch in (int(b) for b in args.batches.split(",")):
                    for sparsity in (float(s) for s in args.sparsities.split(",")):
                        med, nnz = measure_point(size, batch, sparsity, args.rounds, args.graph_k, args.min_ms,
                                                 torch_peer, rng, Path(tmp), layers)
                        row = dict(size=size, batch=batch, sparsity=sparsity, nnz=nnz, **med)
                        rows.append(row)
                        print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()),
                              flush=True)
        finally:
            torch_peer.close()
    df = pd.DataFrame(rows)
    header[-1] = header[-1].replace("at the end: see below", f"at the end {open('/proc/loadavg').read().split()[0]}")
    write_results(df, Path(args.out), markdown(df, header))
    return 0


def write_results(df: pd.DataFrame, out: Path, report: str) -> None:
    """``df`` to ``out`` (CSV) and ``report`` beside it (``.md``), also printed."""
    out.parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(out, index=False)
    out.with_suffix(".md").write_text(report)
    print(report)


if __name__ == "__main__":
    raise SystemExit(main())
