"""``--scheduler``: the same runs on a real Dask LocalCluster on 127.0.0.1 (worker processes)."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

distributed = pytest.importorskip("distributed")

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_sweep_on_a_local_dask_cluster(tmp_path):
    config = tmp_path / "dask.toml"
    config.write_text(
        'name = "dask"\nimplementations = ["dense", "masked", "tfmot"]\nsparsities = [0.6]\n'
        'models = [{name = "mlp", widths = [32]}]\ndatasets = ["digits"]\n'
        "[[schedules]]\nkind = \"one_shot\"\nbegin = 0\n[training]\nepochs = 1\n"
    )
    results = tmp_path / "results"
    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None
    ) as cluster, distributed.Client(cluster) as client:
        worker_pids = set(client.run(os.getpid).values())
        out = subprocess.run(
            [sys.executable, "-m", "experiments", "run", str(config), "--results", str(results),
             "--scheduler", cluster.scheduler_address],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert out.returncode == 0, out.stderr[-3000:]
        assert set(client.run(os.getpid).values()) == worker_pids  # the cluster's workers survived the sweep
    with open(results / "dask" / "runs.csv", newline="") as fh:
        rows = {r["implementation"]: r for r in csv.DictReader(fh)}
    assert sorted(rows) == ["dense", "masked", "tfmot"]
    assert all(r["status"] == "ok" for r in rows.values()), {k: r["error"] for k, r in rows.items()}
    # Keras 3 runs ran inside the Dask workers; tfmot in its own legacy-Keras subprocess.
    assert int(rows["dense"]["pid"]) in worker_pids and int(rows["masked"]["pid"]) in worker_pids
    assert int(rows["tfmot"]["pid"]) not in worker_pids
    assert rows["tfmot"]["keras_impl"] == "tf_keras" and rows["masked"]["keras_impl"] == "keras"
    assert abs(float(rows["masked"]["sparsity"]) - 0.6) < 0.01 and abs(float(rows["tfmot"]["sparsity"]) - 0.6) < 0.01
    assert float(rows["dense"]["sparsity"]) == 0.0
