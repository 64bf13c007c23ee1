"""The notebooks run top to bottom on a real ipykernel from this environment, and their claims hold.

Each notebook is executed with nbclient on the ``python3`` kernel, which
jupyter_client resolves to the interpreter running the tests (the project's
venv; checked by a cell appended to the in-memory copy), with the working
directory set to ``notebooks/`` as Jupyter would. Notebooks are committed
with their outputs (``make notebooks``), so that they read on a repository
page; the runs on the committed tables check that a fresh execution gives the
committed text outputs and figures (``notebooks/execute.py:text_outputs``).
Every notebook asserts the claims in its text against the data, so a stale
claim fails its test; one test changes a number in a copy of the data and
checks that the notebook then fails.

Data: notebook 01 runs against the committed reference sweep ``results/paper``
(skipped only while that folder is absent) and, always, against a synthetic
sweep; notebook 02 against ``results/benchmarks/layer_speed.csv`` (skipped
while absent) and a synthetic benchmark table; notebook 03 against the
committed ``results/partial_freezing`` tables; notebook 04 against the
committed ``results/methods`` sweep.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from tests.experiments.test_figures import write_synthetic

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = REPO / "notebooks"
RESULTS = REPO / "results"
NB01 = NOTEBOOKS / "01_compare_implementations.ipynb"
NB02 = NOTEBOOKS / "02_sparse_kernels.ipynb"
NB03 = NOTEBOOKS / "03_partial_freezing.ipynb"
NB04 = NOTEBOOKS / "04_methods.ipynb"
NB05 = NOTEBOOKS / "05_fashion_mnist.ipynb"
NB06 = NOTEBOOKS / "06_oneshot_transformers.ipynb"
ALL = [NB01, NB02, NB03, NB04, NB05, NB06]
STUDY = ["fmnist_lenet300", "fmnist_lenet300_small_dense", "fmnist_lenet300_patterns", "fmnist_lenet300_imp", "fmnist_lenet5",
         "fmnist_lenet5_small_dense", "fmnist_lenet5_patterns", "fmnist_lenet5_gmp", "fmnist_lenet5_small_dense_sizes"]
ROOT_LINE = 'RESULTS_ROOT = ROOT / "results"'
SWEEP_LINE = 'SWEEP = "paper"'
CHECK = "import sys; print(sys.executable)"


def _patch(nb: nbformat.NotebookNode, old: str, new: str) -> None:
    hits = [c for c in nb.cells if c.cell_type == "code" and old in c.source]
    assert len(hits) == 1, f"expected exactly one code cell containing {old!r}, found {len(hits)}"
    hits[0].source = hits[0].source.replace(old, new)


def _text_outputs(nb: nbformat.NotebookNode) -> list[list[str]]:
    import importlib.util

    spec = importlib.util.spec_from_file_location("notebooks_execute", NOTEBOOKS / "execute.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.text_outputs(nb)


def assert_reproduces_committed(path: Path, fresh: nbformat.NotebookNode) -> None:
    """The fresh execution (on the committed data) gives the committed notebook's text outputs and figures."""
    committed = _text_outputs(nbformat.read(path, as_version=4))
    got = _text_outputs(fresh)[:-1]  # without the interpreter check appended by run_notebook
    assert got == committed, f"{path.name}: outputs differ from the committed ones; run `make notebooks`"


def run_notebook(path: Path, results_root: Path | None = None, sweep: str | None = None) -> nbformat.NotebookNode:
    """Execute a copy of ``path`` in ``notebooks/``; optionally point it at other data."""
    nb = nbformat.read(path, as_version=4)
    if results_root is not None:
        _patch(nb, ROOT_LINE, f"RESULTS_ROOT = Path({str(results_root)!r})")
    if sweep is not None:
        _patch(nb, SWEEP_LINE, f"SWEEP = {sweep!r}")
    nb.cells.append(nbformat.v4.new_code_cell(CHECK))
    client = NotebookClient(
        nb, kernel_name="python3", timeout=120, resources={"metadata": {"path": str(NOTEBOOKS)}}, allow_errors=False
    )
    client.execute()
    printed = "".join(o.get("text", "") for o in nb.cells[-1].outputs if o.output_type == "stream").strip()
    assert Path(printed).resolve() == Path(sys.executable).resolve(), f"kernel ran {printed!r}, not {sys.executable!r}"
    return nb


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_synthetic(tmp_path_factory.mktemp("results"))


@pytest.mark.parametrize("path", ALL, ids=lambda p: p.stem)
def test_notebook_is_committed_with_its_outputs_and_checks_its_claims(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    # nbformat fills missing cell ids in on reading (with a warning that says this becomes an error): check the file.
    ids = [c.get("id") for c in json.loads(path.read_text())["cells"]]
    assert None not in ids and len(set(ids)) == len(ids), f"{path.name}: cells without an id or with a repeated one"
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code, path.name
    assert [c.execution_count for c in code] == list(range(1, len(code) + 1)), f"{path.name}: not executed in order"
    assert any(c.outputs for c in code), f"{path.name}: committed without outputs (run `make notebooks`)"
    assert not any("execution" in c.get("metadata", {}) for c in code), f"{path.name}: wall-clock times committed"
    assert sum("assert " in c.source for c in code) >= 1, f"{path.name}: no cell checks a claim against the data"
    assert nb.metadata["kernelspec"]["name"] == "python3"


def test_01_on_the_reference_sweep() -> None:
    if not (RESULTS / "paper" / "runs.csv").is_file():
        pytest.skip("results/paper/runs.csv is not committed yet (run experiments/configs/paper.toml)")
    assert_reproduces_committed(NB01, run_notebook(NB01))


def test_01_runs_on_a_synthetic_sweep(synthetic: Path) -> None:
    nb = run_notebook(NB01, results_root=synthetic, sweep="synthetic")
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "largest |achieved - target|: 0.0000 points" in text
    images = sum("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert images >= 5  # figures 1-5 drawn and shown


def test_02_on_the_committed_layer_benchmark() -> None:
    if not (RESULTS / "benchmarks" / "layer_speed.csv").is_file():
        pytest.skip("results/benchmarks/layer_speed.csv is not committed yet (run benchmarks/layer_speed.py)")
    assert_reproduces_committed(NB02, run_notebook(NB02))


def test_02_runs_on_a_synthetic_benchmark(synthetic: Path) -> None:
    run_notebook(NB02, results_root=synthetic)


def test_03_on_the_committed_partial_freezing_results() -> None:
    assert (RESULTS / "partial_freezing" / "results.csv").is_file(), "results/partial_freezing/results.csv is committed"
    assert_reproduces_committed(NB03, run_notebook(NB03))


def test_03_fails_when_a_claim_goes_stale(tmp_path: Path) -> None:
    """Frozen accuracy raised to the partial methods': claim 3 (partial beats frozen by 3 points) no longer holds."""
    root = tmp_path / "results"
    shutil.copytree(RESULTS / "partial_freezing", root / "partial_freezing")
    table = root / "partial_freezing" / "results.csv"
    lines = table.read_text().splitlines()
    frozen = [i for i, line in enumerate(lines) if line.startswith("frozen,")]
    assert len(frozen) == 1
    fields = lines[frozen[0]].split(",")
    header = lines[0].split(",")
    partial_acc = [line.split(",")[header.index("test_accuracy")] for line in lines if line.startswith("partial,")][0]
    fields[header.index("test_accuracy")] = partial_acc
    lines[frozen[0]] = ",".join(fields)
    table.write_text("\n".join(lines) + "\n")
    with pytest.raises(CellExecutionError, match="AssertionError"):
        run_notebook(NB03, results_root=root)


def test_04_on_the_committed_methods_sweep() -> None:
    assert (RESULTS / "methods" / "runs.csv").is_file(), "results/methods/runs.csv is committed"
    nb = run_notebook(NB04)
    assert_reproduces_committed(NB04, nb)
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "within 1 point down to 10.0 % remaining, within 3 points down to 5.0 %" in text


def _methods_copy(tmp_path: Path) -> Path:
    """The committed methods sweep without its (uncommitted) checkpoints."""
    root = tmp_path / "results"
    shutil.copytree(RESULTS / "methods", root / "methods", ignore=shutil.ignore_patterns("*.h5", "*.npz", "*.keras", "figures"))
    return root


def test_04_fails_when_a_claim_goes_stale(tmp_path: Path) -> None:
    """RigL at 98 % lowered below SET: claim 4 (the ordering at 98 %) no longer holds."""
    import pandas as pd

    root = _methods_copy(tmp_path)
    table = root / "methods" / "runs.csv"
    runs = pd.read_csv(table, keep_default_na=False, dtype=str)
    rigl = (runs["method"] == "rigl") & (runs["target_sparsity"].astype(float) == 0.98)
    assert rigl.sum() == 3
    runs.loc[rigl, "test_accuracy"] = "0.40"
    runs.to_csv(table, index=False)
    for run_id in runs.loc[rigl, "run_id"]:  # the run's own record too: the reader restores runs.csv from it
        record_path = root / "methods" / "runs" / run_id / "result.json"
        record = json.loads(record_path.read_text())
        record["row"]["test_accuracy"] = 0.40
        record_path.write_text(json.dumps(record))
    with pytest.raises(CellExecutionError, match="AssertionError"):
        run_notebook(NB04, results_root=root)


def test_05_on_the_committed_fashion_mnist_study() -> None:
    for sweep in STUDY:
        assert (RESULTS / sweep / "runs.csv").is_file(), f"results/{sweep}/runs.csv is committed"
    for study in ("fmnist_lenet300", "fmnist_lenet5"):
        assert (RESULTS / study / "latency.csv").is_file(), f"results/{study}/latency.csv is committed"
    nb = run_notebook(NB05)
    assert_reproduces_committed(NB05, nb)


def test_05_fails_when_a_claim_goes_stale(tmp_path: Path) -> None:
    """LiteRT's dense LeNet-300-100 made slower at batch 256 than a form in the TF graph: the claim that LiteRT runs it
    faster than every TF-graph form fails, by name."""
    import pandas as pd

    root = tmp_path / "results"
    for sweep in STUDY:
        shutil.copytree(RESULTS / sweep, root / sweep, ignore=shutil.ignore_patterns("*.h5", "*.keras", "*.npz", "figures"))
    path = root / "fmnist_lenet300" / "latency.csv"
    latency = pd.read_csv(path)
    cell = (latency["family"] == "dense") & (latency["batch"] == 256)
    assert cell.sum() == 1
    latency.loc[cell, "litert_ms"] = 0.6  # the fastest TF-graph form takes 0.57 ms
    latency.to_csv(path, index=False)
    with pytest.raises(CellExecutionError, match=r"AssertionError(\x1b\[\d+m)*: LiteRT's dense LeNet-300-100 is not faster"):
        run_notebook(NB05, results_root=root)


def test_06_on_the_committed_oneshot_study() -> None:
    nb = run_notebook(NB06)
    assert_reproduces_committed(NB06, nb)


def test_06_fails_when_a_claim_goes_stale(tmp_path: Path) -> None:
    """One SparseGPT row's accuracy changed in a copy of oneshot.csv: the committed comparisons no longer follow from
    the rows, and the notebook says so."""
    import pandas as pd

    root = tmp_path / "results"
    shutil.copytree(RESULTS / "fmnist_transformers_oneshot", root / "fmnist_transformers_oneshot")
    path = root / "fmnist_transformers_oneshot" / "oneshot.csv"
    rows = pd.read_csv(path)
    cell = (rows["method"] == "sparsegpt") & (rows["setting"] == "50%") & (rows["finetuned"] == 0)
    rows.loc[rows.index[cell][0], "test_accuracy"] -= 0.05
    rows.to_csv(path, index=False)
    with pytest.raises(CellExecutionError, match=r"AssertionError"):
        run_notebook(NB06, results_root=root)


def _execute_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("notebooks_execute", NOTEBOOKS / "execute.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_execute_names_a_missing_notebook_or_table_in_one_line_writing_nothing(tmp_path: Path, capsys) -> None:
    import subprocess

    out = subprocess.run([sys.executable, str(NOTEBOOKS / "execute.py"), str(tmp_path / "06_nope.ipynb")], cwd=NOTEBOOKS,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stdout == "", out.stderr[-2000:]
    assert out.stderr.startswith(f"error: notebook '{tmp_path / '06_nope.ipynb'}' is missing (not a file); the notebooks are "
                                 "01_compare_implementations.ipynb, ") and len(out.stderr.splitlines()) == 1, out.stderr
    execute = _execute_module()
    copy = tmp_path / NB03.name  # would be rewritten if it ran
    shutil.copy(NB03, copy)
    assert execute.main([str(copy)], root=tmp_path) == 2
    assert capsys.readouterr().err == (
        f"error: results folder '{tmp_path / 'results'}' is missing: the notebooks read the committed tables in it; restore "
        "it with `git checkout -- results` (notebooks/execute.py's INPUTS lists the command that writes each table)\n"
    )
    (tmp_path / "results").mkdir()
    assert execute.main([str(copy)], root=tmp_path) == 2
    assert capsys.readouterr().err == (
        f"error: 03_partial_freezing.ipynb reads '{tmp_path / 'results' / 'partial_freezing' / 'results.csv'}', which is "
        "missing: make it with `python -m experiments.partial_freezing`, or restore the committed one with "
        "`git checkout -- results/partial_freezing/results.csv`\n"
    )
    assert copy.read_bytes() == NB03.read_bytes()


def test_execute_lists_the_tables_every_notebook_reads() -> None:
    """Every notebook has its entry in INPUTS, each table of which is committed and named in the notebook's code."""
    import importlib.util

    execute = _execute_module()
    assert sorted(execute.INPUTS) == [p.stem for p in ALL]
    execute.check_inputs(ALL)
    for path in ALL:
        code = "\n".join(c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code")
        for table, command in execute.INPUTS[path.stem]:
            folder = table.split("/")[1]
            assert f'"{folder}"' in code or f"'{folder}'" in code, (path.name, table)
            words = command.split()  # the script, module and sweep file it names exist
            assert words[0] == "python" and (words[1] == "-m" or (REPO / words[1]).is_file()), command
            assert words[1] != "-m" or importlib.util.find_spec(words[2]) is not None, command
            assert all((REPO / w).is_file() for w in words if w.endswith(".toml")), command


def test_a_print_split_into_two_stream_messages_reads_as_one() -> None:
    """Under load the kernel may send a print's text and its newline as two stream messages (seen once in make test)."""
    whole = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print('a')")])
    split = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print('a')")])
    whole.cells[0].outputs = [nbformat.v4.new_output("stream", name="stdout", text="table\nticket > reinit\n")]
    split.cells[0].outputs = [nbformat.v4.new_output("stream", name="stdout", text="table\nticket > reinit"),
                              nbformat.v4.new_output("stream", name="stdout", text="\n")]
    assert _text_outputs(whole) == _text_outputs(split) == [["table\nticket > reinit\n"]]
    other = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print('a')")])
    other.cells[0].outputs = [nbformat.v4.new_output("stream", name="stdout", text="table\n"),
                              nbformat.v4.new_output("stream", name="stderr", text="warning\n")]
    assert _text_outputs(other) == [["table\n", "warning\n"]]  # two streams stay apart


def test_a_changed_output_is_told_from_the_committed_one() -> None:
    """The comparison sees a changed number (and ignores only memory addresses)."""
    nb = nbformat.read(NB04, as_version=4)
    fresh = nbformat.read(NB04, as_version=4)
    fresh.cells.append(nbformat.v4.new_code_cell(CHECK))
    assert_reproduces_committed(NB04, fresh)
    stream = next(o for c in fresh.cells if c.cell_type == "code" for o in c.outputs
                  if o.output_type == "stream" and "93.50%" in o.text)
    stream.text = stream.text.replace("93.50%", "93.49%", 1)
    with pytest.raises(AssertionError, match="outputs differ"):
        assert_reproduces_committed(NB04, fresh)
    assert nb.cells  # the committed file was only read
