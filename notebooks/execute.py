"""Execute the notebooks on the committed tables and save them with their outputs (``make notebooks``).

The committed notebooks carry their outputs, so that they read on a repository page;
``tests/notebooks/test_notebooks.py`` executes each again and checks that its text outputs are the committed ones
(:func:`text_outputs`: streams and plain-text results, with memory addresses masked; figures are checked
to be there, not pixel for pixel, since rasterisation differs in the last bits between CPUs).

    .venv/bin/python notebooks/execute.py [NOTEBOOK ...]

Before executing any, it checks that every notebook named and every table they read (:data:`INPUTS`, under
``results/``) is there; if not it exits with status 2 and one line naming the missing path and the command
that makes it, writing nothing.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
NOTEBOOKS = sorted(HERE.glob("[0-9][0-9]_*.ipynb"))
_ADDRESS = re.compile(r" at 0x[0-9a-f]+")


def _sweep(name: str) -> tuple[str, str]:
    return f"results/{name}/runs.csv", f"python -m experiments run experiments/configs/{name}.toml"


INPUTS: dict[str, list[tuple[str, str]]] = {
    "01_compare_implementations": [_sweep("paper")],
    "02_sparse_kernels": [("results/benchmarks/layer_speed.csv", "python benchmarks/layer_speed.py")],
    "03_partial_freezing": [("results/partial_freezing/results.csv", "python -m experiments.partial_freezing")],
    "04_methods": [_sweep("methods")],
    "05_fashion_mnist": [
        *(_sweep(f"fmnist_{name}") for name in ("lenet300", "lenet300_small_dense", "lenet300_patterns", "lenet300_imp",
                                                 "lenet5", "lenet5_small_dense", "lenet5_patterns", "lenet5_gmp",
                                                 "lenet5_small_dense_sizes")),
        ("results/fmnist_lenet300/latency.csv", "python benchmarks/deployed_latency.py --checkpoints ROOT"),
        ("results/fmnist_lenet300/history/2026-12-02-unsteady/latency.csv",
         "python benchmarks/deployed_latency.py --checkpoints ROOT (an earlier run, kept)"),
        ("results/fmnist_lenet5/latency.csv", "python benchmarks/deployed_latency.py --checkpoints ROOT --study lenet5"),
    ],
    "06_oneshot_transformers": [
        ("results/fmnist_transformers_oneshot/oneshot.csv",
         "python -m experiments.oneshot_study run, then python -m experiments.oneshot_study table"),
        ("results/fmnist_transformers_oneshot/comparisons.csv", "python -m experiments.oneshot_study table"),
        ("results/fmnist_transformers_oneshot/gmp.csv",
         "python -m experiments run experiments/configs/fmnist_transformers_gmp.toml, then python -m "
         "experiments.oneshot_study table"),
        ("results/fmnist_transformers_oneshot/gmp_comparisons.csv", "python -m experiments.oneshot_study table"),
    ],
}
"""Per notebook (by file stem), the tables it reads, relative to the repository, each with the command that
writes it (all are committed: ``git checkout -- <path>`` restores one)."""


class MissingInput(Exception):
    """A notebook, or a table one reads, is not there: reported as one line naming the path, exit status 2."""


def check_inputs(paths: list[Path], root: Path = REPO) -> None:
    """Check that every notebook in ``paths`` and every table it reads under ``root`` (:data:`INPUTS`) exists.

    Args:
        paths: The notebooks to execute.
        root: The repository, whose ``results/`` the notebooks read.

    Raises:
        MissingInput: naming the first missing notebook, ``results/`` folder or table, and what makes it.
    """
    for path in paths:
        if not path.is_file():
            names = ", ".join(p.name for p in NOTEBOOKS)
            raise MissingInput(f"notebook {str(path)!r} is missing (not a file); the notebooks are {names} in {HERE}")
    results = root / "results"
    if not results.is_dir():
        raise MissingInput(
            f"results folder {str(results)!r} is missing: the notebooks read the committed tables in it; "
            "restore it with `git checkout -- results` (notebooks/execute.py's INPUTS lists the command that writes each table)"
        )
    for path in paths:
        for table, command in INPUTS.get(path.stem, []):
            if not (root / table).is_file():
                raise MissingInput(
                    f"{path.name} reads {str(root / table)!r}, which is missing: make it with `{command}`, "
                    f"or restore the committed one with `git checkout -- {table}`"
                )


def execute(path: Path) -> nbformat.NotebookNode:
    """``path`` executed top to bottom on the ``python3`` kernel in ``notebooks/`` (as Jupyter runs it)."""
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, kernel_name="python3", timeout=300, resources={"metadata": {"path": str(HERE)}}).execute()
    return nb


def text_outputs(nb: nbformat.NotebookNode) -> list[list[str]]:
    """Per code cell, its text outputs (streams, plain-text results and errors) with addresses masked, and a
    ``<image/png>`` marker per figure.

    Consecutive chunks of one stream are joined: the kernel sends a ``print`` as one message or as two
    (the text, then its newline) depending on timing, so a loaded machine splits what a quiet one does not.
    """
    out = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        texts = []
        stream = None  # the stream the last text came from, if it came from one
        for o in cell.outputs:
            if o.output_type == "stream":
                if stream == o.name:
                    texts[-1] += o.text
                else:
                    texts.append(o.text)
                stream = o.name
                continue
            stream = None
            if o.output_type in ("execute_result", "display_data"):
                data = o.get("data", {})
                texts.extend(f"<{kind}>" for kind in ("image/png", "image/svg+xml") if kind in data)
                if "text/plain" in data and "image/png" not in data:
                    texts.append(data["text/plain"])
            elif o.output_type == "error":
                texts.append(f"{o.ename}: {o.evalue}")
        out.append([_ADDRESS.sub(" at 0x...", t) for t in texts])
    return out


def main(argv: list[str], root: Path = REPO) -> int:
    """Execute the notebooks named in ``argv`` (default all) and save each with its outputs.

    Args:
        argv: Notebook paths; empty for every ``notebooks/NN_*.ipynb``.
        root: The repository whose ``results/`` the notebooks read (checked before any runs).

    Returns:
        0, or 2 (one line on stderr, nothing written) if a notebook or a table it reads is missing.
    """
    paths = [Path(a) for a in argv] or NOTEBOOKS
    try:
        check_inputs(paths, root)
    except MissingInput as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for path in paths:
        nb = execute(path)
        for cell in nb.cells:  # execution metadata holds wall-clock times: leave it out of the committed file
            cell.get("metadata", {}).pop("execution", None)
        nbformat.write(nb, path)
        print(f"{path.name}: {sum(len(c.get('outputs', [])) for c in nb.cells)} outputs, {path.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
