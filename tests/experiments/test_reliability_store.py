"""The results folder under damage and contention, in-process and fast: the lock and the table repair."""

from __future__ import annotations

import csv
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from experiments.config import DatasetConfig, ImplementationConfig, ModelConfig, RunConfig, ScheduleConfig
from experiments.lock import Locked, SweepLock
from experiments.store import CURVE_COLUMNS, RUN_COLUMNS, Store, config_columns, read_result
from experiments.tables import TableError
from experiments.summary import format_summary, summarize


def row(run_id: str, status: str = "ok", acc: float = 0.5) -> dict:
    run = RunConfig(ImplementationConfig("masked"), DatasetConfig("digits"), ModelConfig("lenet300"), 0, sparsity=0.5,
                    schedule=ScheduleConfig())
    return {**config_columns(run, "s"), "run_id": run_id, "status": status, "test_accuracy": acc}


def curves(run_id: str, epochs: int = 2) -> list[dict]:
    return [dict(run_id=run_id, epoch=e, metric="test_accuracy", value=0.5 + e / 10) for e in range(1, epochs + 1)]


def write_result(root: Path, run_id: str, status: str = "ok") -> Path:
    path = root / "runs" / run_id / "result.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"row": row(run_id, status), "curves": curves(run_id)}))
    return path


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def finished(root: Path, ids: list[str]) -> Store:
    """A sweep folder whose runs ``ids`` finished normally (result.json, row, curves)."""
    store = Store(root)
    store.open()
    for run_id in ids:
        write_result(root, run_id)
        store.add(row(run_id), curves(run_id))
    return store


@pytest.mark.parametrize("damage", ["empty", "headerless", "deleted"])
def test_damaged_runs_csv_is_rebuilt_from_result_files(tmp_path, damage):
    finished(tmp_path, ["a", "b", "c"])
    runs = tmp_path / "runs.csv"
    if damage == "empty":
        runs.write_bytes(b"")  # a crash or a full disk
    elif damage == "headerless":
        runs.write_text(runs.read_text().split("\n", 1)[1])
    else:
        runs.unlink()
    status = Store(tmp_path)
    assert sorted(status.read()) == ["a", "b", "c"]  # status sees what run will see, writing nothing
    assert damage == "deleted" or runs.read_text().startswith("run_id") is False
    store = Store(tmp_path)
    store.open()
    rows = read_csv(runs)
    assert list(rows[0]) == RUN_COLUMNS and sorted(r["run_id"] for r in rows) == ["a", "b", "c"]
    # appending now writes under the header: the next reader sees every row
    store.add(row("d"), curves("d"))
    assert [r["run_id"] for r in read_csv(runs)][-1] == "d"
    assert Store(tmp_path).read()["d"]["status"] == "ok"


def test_corrupt_result_without_row_is_moved_aside_and_its_run_is_missing(tmp_path):
    finished(tmp_path, ["a", "b"])
    half = tmp_path / "runs" / "c" / "result.json"
    half.parent.mkdir(parents=True)
    half.write_text('{"row": {"run_id": "c", "status": "o')  # half-written, no row in runs.csv
    status = Store(tmp_path)
    assert sorted(status.read()) == ["a", "b"] and status.corrupt_ids() == ["c"]
    assert half.exists()  # read() writes nothing
    store = Store(tmp_path)
    store.open()
    assert sorted(store.rows) == ["a", "b"]
    assert not half.exists() and (half.parent / "result.json.corrupt").exists()
    assert any(str(half) in w and "redone" in w for w in store.warnings)
    with pytest.raises(ValueError, match=str(half.parent / "result.json.corrupt").replace(".", r"\.")):
        read_result(half.parent / "result.json.corrupt")


def test_result_from_another_run_or_without_fields_is_corrupt(tmp_path):
    wrong = write_result(tmp_path, "a")
    os.rename(wrong.parent, tmp_path / "runs" / "b")
    with pytest.raises(ValueError, match="holds run 'a', not 'b'"):
        read_result(tmp_path / "runs" / "b" / "result.json")
    (tmp_path / "runs" / "b" / "result.json").write_text('{"row": {}}')
    with pytest.raises(ValueError, match="not a run record"):
        read_result(tmp_path / "runs" / "b" / "result.json")


def test_duplicate_and_missing_curves_are_repaired_from_result_files(tmp_path):
    finished(tmp_path, ["a", "b"])
    path = tmp_path / "curves.csv"
    text = path.read_text()
    body = text.split("\n", 1)[1]
    path.write_text(text + body)  # a second writer appended every point again
    store = Store(tmp_path)
    store.open()
    points = [(c["run_id"], c["epoch"], c["metric"]) for c in read_csv(path)]
    assert len(points) == len(set(points)) == 4
    path.unlink()  # deleted: every curve is still in result.json
    Store(tmp_path).open()
    kept = read_csv(path)
    assert list(kept[0]) == CURVE_COLUMNS
    assert sorted((c["run_id"], c["epoch"], c["value"]) for c in kept) == [
        ("a", "1", "0.6"), ("a", "2", "0.7"), ("b", "1", "0.6"), ("b", "2", "0.7")
    ]


def test_foreign_runs_csv_is_refused_and_left_alone(tmp_path):
    (tmp_path / "runs.csv").write_text("name,score\nalice,3\n")
    with pytest.raises(ValueError, match=r"runs\.csv has columns \['name', 'score'\].*move it away"):
        Store(tmp_path).open()
    with pytest.raises(ValueError, match="not written by this runner"):
        Store(tmp_path).read()
    assert (tmp_path / "runs.csv").read_text() == "name,score\nalice,3\n"


HOLD = """
import fcntl, json, os, socket, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
os.pwrite(fd, json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "command": "holder"}).encode(), 0)
print("held", flush=True)
time.sleep(60)
"""


def test_lock_names_a_live_holder_and_takes_over_a_dead_one(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path / ".lock")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        lock = SweepLock(tmp_path)
        assert SweepLock(tmp_path).holder()["pid"] == holder.pid
        with pytest.raises(Locked, match=f"in use by pid {holder.pid} on host {socket.gethostname()}"):
            lock.acquire()
    finally:
        holder.kill()
        holder.wait()
    # The holder died (kill -9): the kernel dropped its lock, its name is still in the file.
    assert SweepLock(tmp_path).holder() is None
    with SweepLock(tmp_path, command="me") as lock:
        assert lock.took_over is not None and f"pid {holder.pid}" in lock.took_over
        info = json.loads((tmp_path / ".lock").read_text())
        assert info["pid"] == os.getpid() and info["command"] == "me"
        with pytest.raises(Locked, match=f"pid {os.getpid()}"):
            SweepLock(tmp_path).acquire()  # a second open file description conflicts, in one process too
    assert (tmp_path / ".lock").read_text() == ""  # released and cleared
    with SweepLock(tmp_path) as again:
        assert again.took_over is None


def test_lock_without_flock_trusts_a_dead_pid_on_this_host_only(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    lock = SweepLock(tmp_path)
    fd = os.open(lock.path if lock.path.parent.exists() else tmp_path / ".lock", os.O_RDWR | os.O_CREAT)
    try:
        os.pwrite(fd, json.dumps({"host": socket.gethostname(), "pid": dead.pid}).encode(), 0)
        lock._check_content(fd)  # dead on this host: no exception, taken over
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"host": socket.gethostname(), "pid": os.getpid()}).encode(), 0)
        with pytest.raises(Locked, match=f"pid {os.getpid()}"):
            lock._check_content(fd)
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"host": "elsewhere.example", "pid": dead.pid}).encode(), 0)
        with pytest.raises(Locked, match=r"on host elsewhere\.example.*delete"):
            lock._check_content(fd)
    finally:
        os.close(fd)


def test_summary_keeps_diverged_runs_out_of_means_and_counts_them():
    runs = pd.DataFrame(
        dict(
            dataset="digits", model="mlp", schedule="polynomial", implementation="masked", matmul="",
            target_sparsity=[0.5, 0.5, 0.5, 0.9], seed=[0, 1, 2, 0], status=["ok", "ok", "diverged", "diverged"],
            test_accuracy=[0.8, 0.9, 0.1, 0.1], sparsity=[0.5, 0.5, float("nan"), float("nan")], step_time_ms=1.0,
            latency_b1_ms=1.0, latency_b256_ms=1.0,
        )
    )
    s = summarize(runs).set_index("target_sparsity")
    assert s.loc[0.5, "test_accuracy_mean"] == pytest.approx(0.85)
    assert s.loc[0.5, "seeds"] == 2 and s.loc[0.5, "diverged"] == 1
    assert s.loc[0.9, "seeds"] == 0 and s.loc[0.9, "diverged"] == 1 and pd.isna(s.loc[0.9, "test_accuracy_mean"])
    text = format_summary(summarize(runs))
    assert "diverged" in text.splitlines()[0]
    assert text.splitlines()[2].split()[5] == "diverged"  # the 0.9 cell's accuracy column


def test_a_single_seed_shows_n_not_a_zero_spread():
    """One seed has no spread: the console and the LaTeX table say n=1 instead of '± 0'."""
    from experiments.figures import _latex, main_table

    runs = pd.DataFrame(
        dict(
            dataset="digits", model="mlp", schedule="polynomial", implementation=["dense", "masked", "masked"],
            matmul="", target_sparsity=[0.0, 0.9, 0.5], seed=[0, 0, 0], status="ok", test_accuracy=[0.9, 0.901, 0.95],
            sparsity=[0.0, 0.9, 0.5], step_time_ms=1.0, latency_b1_ms=1.0, latency_b256_ms=1.0,
        )
    )
    text = format_summary(summarize(runs))
    assert "0.9010 (n=1)" in text and "±" not in text
    two = pd.concat([runs, runs.assign(seed=1, test_accuracy=[0.9, 0.903, 0.95])])
    assert "0.9020 ± 0.0014" in format_summary(summarize(two))
    for frame, want, spread in ((runs, "$90.10$ (n=1)", False), (two, "$90.20 \\pm 0.14$", True)):
        table = main_table(frame.assign(label=frame["implementation"], target=frame["target_sparsity"]))
        tex = _latex(table, "caption")
        assert want in tex and ("\\pm" in tex) == spread, tex


def _drop_column(path: Path, column: str) -> None:
    """runs.csv without ``column`` (an editor or a script dropped it), every other cell as it was."""
    rows = read_csv(path)
    header = [c for c in rows[0] if c != column]
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=header, extrasaction="ignore", lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)


def test_a_column_lost_from_runs_csv_is_restored_from_result_files_and_a_crash_loses_nothing(tmp_path):
    finished(tmp_path, ["a", "b"])
    runs = tmp_path / "runs.csv"
    whole = runs.read_text()
    _drop_column(runs, "test_accuracy")
    lacking = runs.read_text()
    status = Store(tmp_path)
    assert status.read()["a"]["test_accuracy"] == "0.5"  # status: restored in memory...
    assert status.restored == [
        f"{runs} lacked column 'test_accuracy': restored for its 2 rows from their runs/<run_id>/result.json"
    ]
    assert status.repairs == [] and runs.read_text() == lacking  # ...writing nothing
    store = Store(tmp_path)
    store.open()
    assert store.restored == status.restored and runs.read_text() == whole  # run: the table as it was before
    # A crash mid-sweep: c finished and was added; d finished (its result.json) but the runner died before its row.
    store.add(row("c"), curves("c"))
    write_result(tmp_path, "c")
    write_result(tmp_path, "d")
    again = Store(tmp_path)
    again.open()
    assert sorted(again.rows) == ["a", "b", "c", "d"] and again.restored == []
    assert {r["run_id"]: r["test_accuracy"] for r in read_csv(runs)} == {"a": "0.5", "b": "0.5", "c": "0.5", "d": "0.5"}


def test_a_column_lost_from_rows_without_result_files_is_refused_naming_file_column_and_row(tmp_path):
    finished(tmp_path, ["a", "b"])
    (tmp_path / "runs" / "b" / "result.json").unlink()  # b's record is gone: nothing restores its accuracy
    half = tmp_path / "runs" / "x" / "result.json"
    half.parent.mkdir()
    half.write_text('{"row"')  # a corrupt record, which open() would move aside: it must not, on refusing
    runs = tmp_path / "runs.csv"
    _drop_column(runs, "test_accuracy")
    before = {p: p.read_bytes() for p in sorted(tmp_path.rglob("*")) if p.is_file()}
    message = (
        f"{runs} lacks column 'test_accuracy', and 1 of its 2 rows have no result.json to restore it from "
        f"(line 3, run 'b': no {tmp_path / 'runs' / 'b' / 'result.json'}): put the column back, or delete those rows"
    )
    for reader in (Store(tmp_path).read, Store(tmp_path).open, Store(tmp_path, hand_made=True).read):
        with pytest.raises(TableError) as info:
            reader()
        assert str(info.value).startswith(message), str(info.value)
    assert {p: p.read_bytes() for p in sorted(tmp_path.rglob("*")) if p.is_file()} == before
    (tmp_path / "runs" / "b" / "result.json").write_text("{")  # there, but unreadable: said so
    with pytest.raises(TableError, match=rf"\(line 3, run 'b': {tmp_path / 'runs' / 'b' / 'result.json'} cannot be read\)"):
        Store(tmp_path).read()
    _drop_column(runs, "run_id")  # no key to match a row to its record
    for hand_made in (False, True):
        with pytest.raises(TableError, match=rf"^{runs} lacks columns \['run_id', 'test_accuracy'\], so its rows cannot be "
                           "matched to their runs' result.json: put the column back, or move the file away"):
            Store(tmp_path, hand_made=hand_made).read()


def test_a_loser_that_comes_before_the_holder_has_written_its_name_waits_for_it(tmp_path):
    """The holder takes the flock, then writes its name: a run refused in between names it, not "unknown"."""
    import fcntl
    import threading

    path = tmp_path / ".lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held, still empty
        info = {"host": "h", "pid": 4242, "started_at": "t", "command": "c"}
        late = threading.Timer(0.3, lambda: os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0))
        late.start()
        with pytest.raises(Locked, match=r"in use by pid 4242 on host h since t \(c\)"):
            SweepLock(tmp_path).acquire()
        late.join()
    finally:
        os.close(fd)
