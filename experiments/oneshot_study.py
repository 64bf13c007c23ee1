"""Issue 35's study, stage 2: trained transformers pruned in one shot (magnitude, Wanda, SparseGPT), with and without
one epoch of fine-tuning, and the papers' claims tested under one pre-set rule.

Stage 1 is the sweep ``experiments/configs/fmnist_transformers_dense.toml`` (vit and mixer trained dense, 3 seeds).
For each of its runs, this stage loads the trained weights (the run's ``checkpoint.weights.h5``, checked against the
run's recorded test accuracy), and for each method and setting of :class:`OneShotStudy`:

1. ``prune.oneshot`` on the first ``calibration`` training images, pruning the blocks' layers (``layers``: the
   attention projections and MLPs; the patch embedding and the head stay dense, as SparseGPT and Wanda leave a
   language model's embeddings and head), then the test and validation accuracy;
2. one epoch of fine-tuning (Adam at ``finetune_lr``, ``prune.UpdatePruningStep``: the one-shot masks are kept),
   then the same accuracies.

A dense row per run gives the trained model's accuracy, and a dense model fine-tuned alike is the control of step 2.
Rows go to ``results/<name>/rows/<run_id>.csv`` as each finishes, so a stopped stage resumes where it was;
``oneshot.csv`` joins them, and ``comparisons.csv`` holds :func:`comparisons`.

Stage 3 (``experiments/configs/fmnist_transformers_gmp.toml``) trains GMP from scratch to 50% and 70% on the same
layers, seeds and data; ``gmp.csv`` holds its runs as rows (:func:`gmp_rows`), and ``gmp_comparisons.csv`` the
one-shot models against them (:data:`GMP_FAMILY`, its own Holm family, fixed before stage 3 ran).

The rule and the claims were fixed before the run (:data:`FAMILY`): one family of comparisons of test accuracy,
each over the (model, seed) pairs (2 models x 3 seeds: paired by seed within a model), two-sided paired t-tests,
Holm's step-down correction over the family at 0.05. A claim holds when its Holm-adjusted p is below 0.05 *and*
its difference has the claimed sign; otherwise it is reported as not established.

    .venv/bin/python -m experiments.oneshot_study run --shard 0/2 &  .venv/bin/python -m experiments.oneshot_study run --shard 1/2
    .venv/bin/python -m experiments.oneshot_study table
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd

from experiments.loader import config_hash, from_dict

RESULTS = Path(__file__).resolve().parents[1] / "results"
ROW_COLUMNS = ["run_id", "model", "seed", "method", "setting", "finetuned", "test_accuracy", "val_accuracy", "test_loss",
               "pruned_sparsity", "seconds", "study_hash"]


@dataclasses.dataclass(frozen=True)
class OneShotStudy:
    """What stage 2 does; its hash is recorded in every row, and rows of another hash are refused.

    Attributes:
        name: The results folder, ``results/<name>/``.
        source: The stage-1 sweep whose dense runs are pruned.
        methods: ``prune.oneshot`` methods.
        sparsities: Unstructured settings (the fraction of each pruned weight set to zero).
        nm: N:M settings ``(m, n)``: ``m`` zeros in every ``n`` consecutive inputs (``prune.NByM(m, n)``).
        calibration: The first this many training images calibrate every layer.
        layers: The layers pruned (``prune.oneshot``'s ``layers=``, a regular expression).
        finetune_epochs: Epochs of fine-tuning after pruning (and of the dense control).
        finetune_at: The settings whose pruned models are fine-tuned (``"70%"`` ...); empty: every setting.
        finetune_lr: Adam's learning rate when fine-tuning.
        batch_size: Examples per fine-tuning step.
    """

    name: str = "fmnist_transformers_oneshot"
    source: str = "fmnist_transformers_dense"
    methods: tuple[str, ...] = ("magnitude", "wanda", "sparsegpt")
    sparsities: tuple[float, ...] = (0.5, 0.6, 0.7, 0.8)
    nm: tuple[tuple[int, int], ...] = ((2, 4), (4, 8))
    calibration: int = 512
    layers: str = r"block_\d+_(attn|mlp_\d|token_\d)"
    finetune_epochs: int = 1
    finetune_lr: float = 1e-4
    batch_size: int = 64
    finetune_at: tuple[str, ...] = ()

    def settings(self) -> list[str]:
        """The settings' labels, in order: ``"50%"`` ... then ``"2:4"`` ... (``m`` zeros of ``n``)."""
        return [f"{round(100 * s)}%" for s in self.sparsities] + [f"{m}:{n}" for m, n in self.nm]

    @property
    def hash(self) -> str:
        """16 hex digits of the config's hash."""
        return config_hash(self)[:16]

    @property
    def same_rows(self) -> set[str]:
        """The hashes whose rows this config would write alike: its own, and those of the configs that differ from it
        only in :attr:`finetune_at` (which says which rows exist, not what any row holds)."""
        return {self.hash, dataclasses.replace(self, finetune_at=()).hash}

    def finetunes(self, setting: str) -> bool:
        """Whether the models pruned at ``setting`` are fine-tuned."""
        return not self.finetune_at or setting in self.finetune_at


STUDY = OneShotStudy(finetune_at=("70%",))
"""The study as run. It started with every setting fine-tuned (``finetune_at=()``); at 04:28 UTC on 2026-12-04, with
43 rows written (two mixer runs part-way), the fine-tuning was cut to 70%, the setting the claims read: at about 50 s
(mixer) and 110 s (vit) a fine-tuning epoch, the whole stage would have run past the session's time. The claims were
not changed. The rows made before stay, under the first config's hash; the summary counts the pairs it averages."""

FAMILY: list[tuple[str, tuple[str, str, int], tuple[str, str, int], str]] = [
    # (claim, a, b, kind): a, b are (method, setting, finetuned); kind "diff": a - b > 0;
    # "gap": (a - magnitude at a's setting) - (b - magnitude at b's setting) > 0, i.e. the gap to magnitude grows;
    # "closes": fine-tuning a closes more than half of its gap to dense: (a_ft - a) - 0.5 (dense - a) > 0.
    ("SparseGPT above Wanda at 50%, no fine-tune", ("sparsegpt", "50%", 0), ("wanda", "50%", 0), "diff"),
    ("SparseGPT above Wanda at 60%, no fine-tune", ("sparsegpt", "60%", 0), ("wanda", "60%", 0), "diff"),
    ("Wanda above magnitude at 50%, no fine-tune", ("wanda", "50%", 0), ("magnitude", "50%", 0), "diff"),
    ("Wanda above magnitude at 60%, no fine-tune", ("wanda", "60%", 0), ("magnitude", "60%", 0), "diff"),
    ("SparseGPT's gap over magnitude larger at 80% than at 50%", ("sparsegpt", "80%", 0), ("sparsegpt", "50%", 0), "gap"),
    ("Wanda's gap over magnitude larger at 80% than at 50%", ("wanda", "80%", 0), ("wanda", "50%", 0), "gap"),
    ("2:4 below 50% unstructured, SparseGPT", ("sparsegpt", "50%", 0), ("sparsegpt", "2:4", 0), "diff"),
    ("2:4 below 50% unstructured, Wanda", ("wanda", "50%", 0), ("wanda", "2:4", 0), "diff"),
    ("one epoch closes most of magnitude's gap at 70%", ("magnitude", "70%", 1), ("magnitude", "70%", 0), "closes"),
    ("one epoch closes most of Wanda's gap at 70%", ("wanda", "70%", 1), ("wanda", "70%", 0), "closes"),
    ("one epoch closes most of SparseGPT's gap at 70%", ("sparsegpt", "70%", 1), ("sparsegpt", "70%", 0), "closes"),
]
"""The claims tested (Frantar & Alistarh 2023; Sun et al. 2024), fixed before the run: SparseGPT >= Wanda >>
magnitude at 50-60% with no fine-tune; the gap grows with sparsity; 2:4 is harder than 50% unstructured;
fine-tuning closes most of the gap."""


GMP_SOURCE = "fmnist_transformers_gmp"
"""Stage 3: GMP trained from scratch (``experiments/configs/fmnist_transformers_gmp.toml``), 50% and 70%."""

GMP_FAMILY: list[tuple[str, tuple[str, str, int], tuple[str, str, int], str]] = [
    ("magnitude (one shot, no fine-tune) against GMP at 50%", ("magnitude", "50%", 0), ("gmp", "50%", 0), "diff"),
    ("Wanda (one shot, no fine-tune) against GMP at 50%", ("wanda", "50%", 0), ("gmp", "50%", 0), "diff"),
    ("SparseGPT (one shot, no fine-tune) against GMP at 50%", ("sparsegpt", "50%", 0), ("gmp", "50%", 0), "diff"),
    ("magnitude (one shot, one epoch) against GMP at 70%", ("magnitude", "70%", 1), ("gmp", "70%", 0), "diff"),
    ("Wanda (one shot, one epoch) against GMP at 70%", ("wanda", "70%", 1), ("gmp", "70%", 0), "diff"),
    ("SparseGPT (one shot, one epoch) against GMP at 70%", ("sparsegpt", "70%", 1), ("gmp", "70%", 0), "diff"),
]
"""One-shot pruning against GMP from scratch (stage 3), fixed before stage 3 ran. No paper claims a direction, so
a difference is established when its Holm-adjusted p (over these 6) is below 0.05, whatever its sign."""


def gmp_rows(study: OneShotStudy = STUDY, results: Path = RESULTS, source: str = GMP_SOURCE) -> pd.DataFrame:
    """Stage 3's finished runs as rows of :func:`table` (``method == "gmp"``, ``finetuned == 0``).

    Raises:
        FileNotFoundError: stage 3 has not run.
        ValueError: a run pruned a layer outside ``study.layers``, or left one inside it short of the run's target
            (more than half a point: unstructured pruning rounds per layer); then it is not the comparison stage 2
            makes.
    """
    import re

    path = results / source / "runs.csv"
    if not path.exists():
        raise FileNotFoundError(f"no {path}: run stage 3 first (python -m experiments run "
                                f"experiments/configs/{source}.toml)")
    runs = pd.read_csv(path)
    runs = runs[runs["status"] == "ok"]
    out = []
    for r in runs.itertuples():
        layers = json.loads(r.layer_sparsity)
        outside = sorted(k for k, v in layers.items() if v > 0 and not re.fullmatch(study.layers, k.split("/")[0]))
        if outside:
            raise ValueError(f"run {r.run_id} pruned {outside}, which stage 2 keeps dense")
        inside = [v for k, v in layers.items() if re.fullmatch(study.layers, k.split("/")[0])]
        short = sorted(k for k, v in layers.items()
                       if re.fullmatch(study.layers, k.split("/")[0]) and v < r.target_sparsity - 0.005)
        if short:
            raise ValueError(f"run {r.run_id} left {short} below its target {r.target_sparsity}, which stage 2 prunes "
                             "to it")
        out.append(dict(run_id=r.run_id, model=r.model, seed=int(r.seed), method="gmp",
                        setting=f"{round(100 * r.target_sparsity)}%", finetuned=0, test_accuracy=r.test_accuracy,
                        val_accuracy=r.val_accuracy, test_loss=r.test_loss, pruned_sparsity=float(np.mean(inside)),
                        seconds=r.fit_seconds, study_hash=""))
    return pd.DataFrame(out, columns=ROW_COLUMNS).sort_values(["model", "setting", "seed"]).reset_index(drop=True)


def source_runs(study: OneShotStudy = STUDY, results: Path = RESULTS) -> pd.DataFrame:
    """The stage-1 runs that finished (``status == "ok"``), from ``runs.csv``."""
    path = results / study.source / "runs.csv"
    if not path.exists():
        raise FileNotFoundError(f"no {path}: run stage 1 first (python -m experiments run "
                                f"experiments/configs/{study.source}.toml)")
    runs = pd.read_csv(path)
    return runs[runs["status"] == "ok"].sort_values(["model", "seed"]).reset_index(drop=True)


def _rows_path(study: OneShotStudy, results: Path, run_id: str) -> Path:
    return results / study.name / "rows" / f"{run_id}.csv"


def _done(path: Path, study: OneShotStudy) -> set[tuple[str, str, int]]:
    if not path.exists():
        return set()
    rows = pd.read_csv(path)
    other = set(rows["study_hash"].astype(str)) - study.same_rows
    if other:
        raise ValueError(f"{path} holds rows of another study config ({sorted(other)}, this one is {study.hash}); "
                         "move it away to rerun")
    return {(r.method, r.setting, int(r.finetuned)) for r in rows.itertuples()}


def _append(path: Path, row: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    new = not path.exists()
    pd.DataFrame([row], columns=ROW_COLUMNS).to_csv(path, mode="a", header=new, index=False)
    with open(path, "a") as fh:  # on disk before the next row starts: a crash loses at most the row in flight
        os.fsync(fh.fileno())


def _pruned_sparsity(model: Any, pattern: str) -> float:
    import re

    import prune

    report = prune.sparsity_report(model)
    chosen = report[[re.fullmatch(pattern, str(name)) is not None for name in report["layer"]]]
    return float(1.0 - chosen["nnz"].sum() / chosen["size"].sum()) if len(chosen) else 0.0


def prune_run(row: pd.Series, study: OneShotStudy = STUDY, results: Path = RESULTS,
              log: Callable[[str], None] = print) -> Path:
    """Every method and setting of ``study`` on one stage-1 run; returns its rows file. Finished rows are skipped.

    Raises:
        ValueError: the trained weights do not give the run's recorded test accuracy, or the rows file holds
            another study's rows.
    """
    import keras

    import prune
    from experiments.config import RunConfig
    from experiments.data import load
    from experiments.models import seeded_model

    run_dir = results / study.source / "runs" / row["run_id"]
    run = from_dict(RunConfig, json.loads((run_dir / "config.json").read_text())["run"])
    out = _rows_path(study, results, row["run_id"])
    done = _done(out, study)
    data = load(run.dataset)
    plain, _ = seeded_model(run, data, keras)
    plain.load_weights(str(run_dir / "checkpoint.weights.h5"))
    x_cal = data.x_train[: study.calibration]

    def evaluate(model: Any) -> dict[str, float]:
        model.compile(loss="sparse_categorical_crossentropy", metrics=["accuracy"])
        loss, acc = model.evaluate(data.x_test, data.y_test, batch_size=1000, verbose=0)
        _, val = model.evaluate(data.x_val, data.y_val, batch_size=1000, verbose=0)
        return dict(test_accuracy=acc, val_accuracy=val, test_loss=loss)

    def finetune(model: Any, masked: bool) -> None:
        keras.utils.set_random_seed(run.seed)
        model.compile(keras.optimizers.Adam(study.finetune_lr), loss="sparse_categorical_crossentropy",
                      metrics=["accuracy"])
        model.fit(data.x_train, data.y_train, batch_size=study.batch_size, epochs=study.finetune_epochs, verbose=0,
                  shuffle=True, callbacks=[prune.UpdatePruningStep()] if masked else [])

    base = dict(run_id=row["run_id"], model=row["model"], seed=int(row["seed"]), study_hash=study.hash)
    dense = evaluate(plain)
    if abs(dense["test_accuracy"] - float(row["test_accuracy"])) > 3e-4:  # 3 images of 10,000: batch-order rounding
        raise ValueError(f"run {row['run_id']}: its checkpoint gives test accuracy {dense['test_accuracy']:.6f}, "
                         f"runs.csv records {float(row['test_accuracy']):.6f}")
    if ("dense", "0%", 0) not in done:
        _append(out, {**base, "method": "dense", "setting": "0%", "finetuned": 0, **dense, "pruned_sparsity": 0.0,
                      "seconds": 0.0})
    if ("dense", "0%", 1) not in done:
        t0 = time.perf_counter()
        control = keras.models.clone_model(plain)
        control.set_weights(plain.get_weights())
        finetune(control, masked=False)
        _append(out, {**base, "method": "dense", "setting": "0%", "finetuned": 1, **evaluate(control),
                      "pruned_sparsity": 0.0, "seconds": time.perf_counter() - t0})
    for method in study.methods:
        for setting, (sparsity, nm) in zip(study.settings(), [(s, None) for s in study.sparsities] + [(None, p) for p in study.nm]):
            wanted = {(method, setting, 0)} | ({(method, setting, 1)} if study.finetunes(setting) else set())
            if wanted <= done:
                continue
            t0 = time.perf_counter()
            pruned = prune.oneshot(plain, x_cal, sparsity, method=method, layers=study.layers, verbose=False,
                                   pattern=None if nm is None else prune.NByM(*nm))
            seconds = time.perf_counter() - t0
            if (method, setting, 0) not in done:
                _append(out, {**base, "method": method, "setting": setting, "finetuned": 0, **evaluate(pruned),
                              "pruned_sparsity": _pruned_sparsity(pruned, study.layers), "seconds": seconds})
            if (method, setting, 1) not in wanted or (method, setting, 1) in done:
                log(f"{row['run_id']} ({row['model']}, seed {row['seed']}): {method} {setting} done")
                continue
            t0 = time.perf_counter()
            finetune(pruned, masked=True)
            _append(out, {**base, "method": method, "setting": setting, "finetuned": 1, **evaluate(pruned),
                          "pruned_sparsity": _pruned_sparsity(pruned, study.layers),
                          "seconds": seconds + time.perf_counter() - t0})
            log(f"{row['run_id']} ({row['model']}, seed {row['seed']}): {method} {setting} done")
    return out


def table(study: OneShotStudy = STUDY, results: Path = RESULTS) -> pd.DataFrame:
    """Every finished row (``oneshot.csv``), sorted."""
    files = sorted((results / study.name / "rows").glob("*.csv"))
    if not files:
        raise FileNotFoundError(f"no rows under {results / study.name / 'rows'}: run the stage first")
    rows = pd.concat([pd.read_csv(f) for f in files], ignore_index=True)
    order = {m: i for i, m in enumerate(("dense", *study.methods))}
    settings = {s: i for i, s in enumerate(["0%", *study.settings()])}
    key = rows["method"].map(order) * 1000 + rows["setting"].map(settings) * 10 + rows["finetuned"]
    return rows.assign(_key=key).sort_values(["model", "_key", "seed"]).drop(columns="_key").reset_index(drop=True)


def _series(rows: pd.DataFrame, method: str, setting: str, finetuned: int) -> pd.Series:
    """Test accuracy indexed by ``model/seed`` (the pairing unit)."""
    r = rows[(rows["method"] == method) & (rows["setting"] == setting) & (rows["finetuned"] == finetuned)]
    return pd.Series(r["test_accuracy"].to_numpy(), index=r["model"] + "/" + r["seed"].astype(str))


def comparisons(rows: pd.DataFrame, family: list[tuple[str, tuple[str, str, int], tuple[str, str, int], str]] = FAMILY,
                signed: bool = True) -> pd.DataFrame:
    """A family of comparisons, in points of test accuracy: difference, 95% interval, raw and Holm-adjusted p, ``holds``.

    Args:
        rows: :func:`table`'s rows (with :func:`gmp_rows` appended for :data:`GMP_FAMILY`).
        family: :data:`FAMILY` (the default) or :data:`GMP_FAMILY`.
        signed: ``holds`` needs the claimed sign (a positive difference) as well as Holm's p below 0.05; ``False``:
            Holm's p alone (a two-sided finding).
    """
    from experiments.stats import holm, paired

    dense = _series(rows, "dense", "0%", 0)
    out = []
    for claim, a, b, kind in family:
        sa, sb = _series(rows, *a), _series(rows, *b)
        if kind == "gap":
            sa = sa - _series(rows, "magnitude", a[1], 0)
            sb = sb - _series(rows, "magnitude", b[1], 0)
        elif kind == "closes":
            sa, sb = sa - sb, 0.5 * (dense - sb)
        pairs = sorted(set(dense.index))
        missing = sorted(set(pairs) - set(sa.dropna().index) | set(pairs) - set(sb.dropna().index))
        if missing:
            raise ValueError(f"claim {claim!r}: no rows for the pairs {missing}; finish stage 2 first")
        r = paired(sa, sb)
        out.append(dict(claim=claim, kind=kind, diff=100 * r.mean, low=100 * r.low, high=100 * r.high, p=r.p_value,
                        wins=r.wins, n=r.n))
    frame = pd.DataFrame(out)
    frame["holm_p"] = holm(frame["p"])
    frame["holds"] = (frame["holm_p"] < 0.05) & ((frame["diff"] > 0) | (not signed))
    return frame


def _shard(text: str) -> tuple[int, int]:
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shard must look like 0/2, got {text!r}") from None
    if not 0 <= i < n:
        raise argparse.ArgumentTypeError(f"--shard i/n needs 0 <= i < n, got {text!r}")
    return i, n


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="prune and fine-tune every stage-1 run (resumes)")
    r.add_argument("--shard", type=_shard, default=(0, 1), help="i/n: this process takes runs i, i+n, ...")
    r.add_argument("--threads", type=int, default=1, help="TensorFlow's intra-op threads (default 1)")
    r.add_argument("--runs", default="", help="comma-separated stage-1 run ids to take (default: every finished one)")
    sub.add_parser("table", help="join the rows into oneshot.csv and test the claims into comparisons.csv (and, once "
                   "stage 3 has run, gmp.csv and gmp_comparisons.csv)")
    args = p.parse_args(argv)
    if args.command == "run":
        if args.threads < 1:
            p.error(f"--threads must be >= 1, got {args.threads}")
        runs = source_runs()
        wanted = [r for r in args.runs.split(",") if r]
        unknown = sorted(set(wanted) - set(runs["run_id"]))
        if unknown:
            p.error(f"--runs: {unknown} are not finished runs of {STUDY.source} ({sorted(runs['run_id'])})")
        if wanted:
            runs = runs[runs["run_id"].isin(wanted)].reset_index(drop=True)
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
        tf.config.threading.set_inter_op_parallelism_threads(1)
        i, n = args.shard
        for k in range(i, len(runs), n):
            prune_run(runs.iloc[k], log=lambda line: print(line, flush=True))
        return 0
    rows = table()
    folder = RESULTS / STUDY.name
    rows.to_csv(folder / "oneshot.csv", index=False)
    frame = comparisons(rows)
    frame.to_csv(folder / "comparisons.csv", index=False)
    (folder / "study.json").write_text(json.dumps({"hash": STUDY.hash, **dataclasses.asdict(STUDY)}, indent=2) + "\n")
    print(frame.round(4).to_string(index=False))
    if (RESULTS / GMP_SOURCE / "runs.csv").exists():
        gmp = gmp_rows()
        gmp.to_csv(folder / "gmp.csv", index=False)
        against = comparisons(pd.concat([rows, gmp], ignore_index=True), GMP_FAMILY, signed=False)
        against.to_csv(folder / "gmp_comparisons.csv", index=False)
        print(against.round(4).to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
