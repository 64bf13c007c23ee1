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
              torch.mv at batch 1 (MKL's sparse BLAS in the CPU wheels), **at torch's defaults**:
              its own thread count and OpenMP wait policy, as a user runs it. ``--torch-passive``
              adds a second, labelled column with ``OMP_WAIT_POLICY=PASSIVE``.

Under ``benchmarks/protocol.py``: the machine (CPU, flags, cores), TensorFlow's threads, the load before and
during the run (a busy machine is refused unless ``--allow-loaded``), and TensorFlow's dense GEMM in GFLOPS,
measured in the same run, head the table. The TensorFlow layers are timed per application inside a graph, as
in a real model: K applications to distinct inputs, net of a floor graph that reads the same inputs and applies
nothing (:func:`protocol.per_application`), so the fixed cost of calling a function is not in it and no time
can come out negative. scipy and torch are timed per call in a Python loop (the loop adds ~1 us). Each
measurement repeats its calls for at least ``--min-ms``; medians over ``--rounds`` interleaved rounds (shuffled
order within each round), with their min-max in the CSV.

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
sys.path.insert(0, str(Path(__file__).resolve().parent))

import protocol  # noqa: E402

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
if threads > 0:  # 0: torch's own default, as a user runs it
    torch.set_num_threads(threads)
import os
print(json.dumps({"version": torch.__version__, "threads": torch.get_num_threads(),
                  "mkl": bool(torch.backends.mkl.is_available()),
                  "wait_policy": os.environ.get("OMP_WAIT_POLICY", "unset (default)")}), flush=True)
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

    def __init__(self, python: str | None, threads: int = 0, env: dict[str, str] | None = None) -> None:
        self.proc, self.note, self.info = None, "", {}
        if not python or not Path(python).exists():
            self.note = f"torch not measured: no interpreter with torch ({python or 'none given'}; --torch-python)"
            return
        self.proc = subprocess.Popen([python, "-c", TORCH_WORKER, str(threads)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env={**os.environ, **(env or {})})
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


def measure_point(size, batch, sparsity, rounds, min_ms, torch_peers, rng, workdir, layers, k_max=256):
    """Times at one point, as :class:`protocol.Samples` (scipy, torch) or :class:`protocol.PerApplication`
    (the TensorFlow layers), by column name; and the number of entries kept."""
    import scipy.sparse as sp
    import tensorflow as tf

    n_in = n_out = size
    w = (rng.standard_normal((n_in, n_out)) * np.sqrt(2.0 / n_in)).astype(np.float32)
    pool_np = [rng.standard_normal((batch, n_in)).astype(np.float32) for _ in range(8)]
    pool = [tf.constant(x) for x in pool_np]
    built, mask = {}, None
    for name, factory in layers.items():
        layer, m = factory(w, rng, sparsity)
        built[name] = layer
        mask = m if name == "native" or mask is None else mask
    if "native" not in built:
        mask = random_mask(rng, n_in, n_out, sparsity)
    wt = sp.csr_matrix((w * mask).T)  # rows = outputs
    x0 = pool_np[0]
    ref = (x0 @ (w * mask)).T
    np.testing.assert_allclose((wt @ x0.T), ref, rtol=1e-3, atol=1e-3)
    fns = {"scipy": (lambda: wt @ x0[0]) if batch == 1 else (lambda: (wt @ x0.T).T)}
    for col, peer in torch_peers.items():
        if peer.proc is None:
            continue
        path, check = workdir / "w.npz", workdir / "y.npy"
        np.savez(path, indptr=wt.indptr, indices=wt.indices, data=wt.data.astype(np.float32),
                 shape=np.array(wt.shape), x=x0)
        peer.ask(op="load", path=str(path), check=str(check))
        np.testing.assert_allclose(np.load(check), ref, rtol=1e-3, atol=1e-3)
        fns[col] = (lambda peer=peer: peer.ask(op="time", min_ms=min_ms)["ms"])
    out: dict = {}
    for name, layer in built.items():
        out[name] = protocol.per_application(layer, pool, rounds=rounds, min_ms=min_ms, k_max=k_max)
    # the peers: interleaved rounds; the torch children time themselves (min_ms of calls) and answer in ms
    times = {k: [] for k in fns}
    keys = list(fns)
    order_rng = np.random.default_rng(int(rng.integers(2**31)))
    for _ in range(rounds):
        order_rng.shuffle(keys)
        for key in keys:
            if key.startswith("torch"):
                times[key].append(fns[key]())
            else:
                times[key].append(protocol.time_calls(fns[key], min_ms))
    out.update({k: protocol.Samples(tuple(v)) for k, v in times.items()})
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


def _ms(v) -> float:
    """The median of a Samples, the net time of a resolved PerApplication, else NaN."""
    if isinstance(v, protocol.Samples):
        return v.median
    return float("nan") if v.ms is None else v.ms


def markdown(df: pd.DataFrame, header: str, impls: list[str]) -> str:
    lines = [header, "",
             "Milliseconds per application (median of the rounds; the CSV has each one's min and max); **bold** = "
             "fastest; `x_dense` = dense's time over native's; `x_peer` = the faster of scipy and torch (at its "
             "defaults) over native's (>= 1: native at least as fast). `< floor`: not resolved from the graph's "
             "own cost at the largest K tried.", ""]
    lines.append("| size | batch | sparsity | " + " | ".join(impls) + " | x_dense | x_peer |")
    lines.append("|---|---|---|" + "---|" * (len(impls) + 2))
    for _, row in df.iterrows():
        vals = {c: row[c] for c in impls}
        known = [v for v in vals.values() if pd.notna(v)]
        best = min(known) if known else None
        cells = [("-" if c.startswith("torch") else "< floor") if pd.isna(v) else (f"**{v:.3f}**" if v == best else f"{v:.3f}")
                 for c, v in vals.items()]
        peers = [row[c] for c in ("scipy", "torch") if c in df.columns and pd.notna(row[c])]
        if "native" in df.columns and pd.notna(row["native"]):
            x_dense = f"{row['dense'] / row['native']:.2f}" if pd.notna(row["dense"]) else "-"
            x_peer = f"{min(peers) / row['native']:.2f}" if peers else "-"
        else:
            x_dense = x_peer = "-"
        lines.append(f"| {int(row['size'])}² | {int(row['batch'])} | {row['sparsity']:.0%} | " + " | ".join(cells)
                     + f" | {x_dense} | {x_peer} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1024,4096")
    parser.add_argument("--batches", default=",".join(map(str, BATCHES)))
    parser.add_argument("--sparsities", default=",".join(map(str, SPARSITIES)))
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--k-max", type=int, default=256, help="most applications per graph call (protocol.per_application)")
    parser.add_argument("--min-ms", type=float, default=20.0, help="each measurement repeats calls for this long")
    parser.add_argument("--threads", type=int, default=0, help="TensorFlow's intra-op threads (default: the usable cores)")
    parser.add_argument("--torch-python", default=os.environ.get("PRUNE_TORCH_PYTHON") or str(DEFAULT_TORCH))
    parser.add_argument("--torch-passive", action="store_true",
                        help="also time torch with OMP_WAIT_POLICY=PASSIVE, in a second labelled column")
    parser.add_argument("--out", default=str(ROOT / "results" / "benchmarks" / "peers.csv"))
    parser.add_argument("--seed", type=int, default=0)
    protocol.add_arguments(parser)
    args = parser.parse_args(argv)

    import scipy
    import tensorflow as tf

    import prune  # noqa: F401  (sets the oneDNN switches before any graph is built)
    from prune import native

    intra, inter = protocol.fix_tf_threads(args.threads or None)
    st = native.status()
    torch_peers = {"torch": protocol_torch(args.torch_python, {})}
    if args.torch_passive:
        torch_peers["torch_passive"] = protocol_torch(args.torch_python, {"OMP_WAIT_POLICY": "PASSIVE"})
    pids = [p.proc.pid for p in torch_peers.values() if p.proc is not None]
    load = protocol.start_or_refuse(args, pids=pids)
    if load is None:
        for p in torch_peers.values():
            p.close()
        return protocol.REFUSED
    gemm = protocol.dense_gemm_gflops()
    mach = protocol.machine()
    t = torch_peers["torch"]
    torch_line = (f"torch {t.info['version']} (MKL {t.info['mkl']}) at its defaults: {t.info['threads']} threads, "
                  f"OMP_WAIT_POLICY {t.info['wait_policy']}" if t.proc else t.note)
    if "torch_passive" in torch_peers and torch_peers["torch_passive"].proc:
        torch_line += "; column torch_passive: the same with OMP_WAIT_POLICY=PASSIVE (not a default)"
    rng = np.random.default_rng(args.seed)
    layers = tf_layers(("dense", "native") if st.available else ("dense",))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        try:
            for size in (int(s) for s in args.sizes.split(",")):
                for batch in (int(b) for b in args.batches.split(",")):
                    for sparsity in (float(s) for s in args.sparsities.split(",")):
                        got, nnz = measure_point(size, batch, sparsity, args.rounds, args.min_ms, torch_peers, rng,
                                                 Path(tmp), layers, k_max=args.k_max)
                        row = dict(size=size, batch=batch, sparsity=sparsity, nnz=nnz)
                        for k, v in got.items():
                            row[k] = _ms(v)
                            row[f"{k}_min"] = v.low
                            row[f"{k}_max"] = v.high
                            if isinstance(v, protocol.PerApplication):
                                row[f"{k}_k"] = v.k
                        rows.append(row)
                        print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()),
                              flush=True)
        finally:
            for p in torch_peers.values():
                p.close()
    load.stop()
    df = pd.DataFrame(rows)
    impls = [c for c in ("dense", "native", "scipy", "torch", "torch_passive") if c in df.columns]
    header = protocol.header(
        "SparseDense against its peers", mach, load, gemm,
        f"TensorFlow {tf.__version__}: intra_op={intra}, inter_op={inter}; scipy {scipy.__version__} (single-threaded); "
        f"{torch_line}",
        [f"TensorFlow layers: per application in a graph, net of the floor (K from 8 up to {args.k_max}); "
         f"medians of {args.rounds} interleaved rounds, each >= {args.min_ms:g} ms of calls."],
    )
    write_results(df, Path(args.out), markdown(df, header, impls))
    return 0


def protocol_torch(python: str | None, env: dict[str, str]) -> "TorchPeer":
    """A torch child at torch's own thread default (``threads=0``), with ``env`` added."""
    return TorchPeer(python, 0, env)


def write_results(df: pd.DataFrame, out: Path, report: str) -> None:
    """``df`` to ``out`` (CSV) and ``report`` beside it (``.md``), also printed."""
    out.parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(out, index=False)
    out.with_suffix(".md").write_text(report)
    print(report)


if __name__ == "__main__":
    raise SystemExit(main())
