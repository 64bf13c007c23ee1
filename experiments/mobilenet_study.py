"""Zhu & Gupta's MobileNet comparison on Fashion-MNIST (issue 34): the 7 comparisons fixed in
``experiments/configs/fmnist_mobilenet_gmp.toml`` before the run, from the committed runs tables, Holm-corrected.

    .venv/bin/python -m experiments.mobilenet_study      # prints the table, writes results/fmnist_mobilenet_gmp/comparisons.csv
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from experiments.figures import read_tables
from experiments.stats import holm, mean_ci, paired, welch

RESULTS = Path(__file__).resolve().parents[1] / "results"
FAMILY = [("gmp 0.5", "mobilenet-a0.75", welch), ("gmp 0.75", "mobilenet-a0.5", welch),
          ("gmp 0.9", "mobilenet-a0.375", welch), ("gmp 0.9", "mobilenet-a0.25", welch),
          ("gmp 0.5", "mobilenet", paired), ("gmp 0.75", "mobilenet", paired), ("gmp 0.9", "mobilenet", paired)]
"""``(a, b, test)``: mean test accuracy of ``a`` minus ``b``; Welch across architectures, paired by seed within one."""


def accuracies(results: Path = RESULTS) -> dict[str, pd.Series]:
    """Final test accuracy by seed for each cell: ``gmp <sparsity>`` and each dense model's label."""
    gmp, _ = read_tables(results / "fmnist_mobilenet_gmp")
    small, _ = read_tables(results / "fmnist_mobilenet_small_dense")
    gmp, small = gmp[gmp["status"] == "ok"], small[small["status"] == "ok"]
    acc = {f"gmp {s:g}": g.set_index("seed")["test_accuracy"] for s, g in gmp.groupby("target_sparsity")}
    acc |= {m: g.set_index("seed")["test_accuracy"] for m, g in small.groupby("model")}
    return acc


def comparisons(results: Path = RESULTS) -> pd.DataFrame:
    """The family: difference in points with its 95% interval, the raw and the Holm-adjusted p, and ``holds``."""
    acc = accuracies(results)
    rows = []
    for a, b, test in FAMILY:
        r = test(acc[a], acc[b])
        rows.append(dict(comparison=f"{a} - {b}", test=test.__name__, diff=100 * r.mean, low=100 * r.low,
                         high=100 * r.high, p=r.p_value, n=r.n))
    table = pd.DataFrame(rows)
    table["holm_p"] = holm(table["p"])
    table["holds"] = table["holm_p"] < 0.05
    return table


def main() -> int:
    for k, v in accuracies().items():
        ci = mean_ci(v)
        print(f"{k:18s} {100 * ci.mean:.2f} [{100 * ci.low:.2f}, {100 * ci.high:.2f}] (n={ci.n})")
    table = comparisons()
    print(table.round(4).to_string(index=False))
    table.to_csv(RESULTS / "fmnist_mobilenet_gmp" / "comparisons.csv", index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
