"""benchmarks/protocol.py: the machine record, the load arithmetic, the refusal of a busy machine, and the
floor rule that keeps every reported time positive. Exact values on fixed readings; one real busy machine."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import protocol  # noqa: E402
from protocol import Busy, CpuReading, LoadMonitor, busy_fraction, resolve  # noqa: E402

CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 17
model name\t: AMD EPYC 9R14
flags\t\t: fpu sse2 avx2 fma avx512f avx512bw avx512vl avx512_vp2intersect
processor\t: 1
model name\t: AMD EPYC 9R14
"""


def test_the_machine_record_names_model_family_and_the_flags_that_pick_a_path():
    cpu, family, flags = protocol._cpuinfo(CPUINFO)
    assert (cpu, family) == ("AMD EPYC 9R14", "25/17")
    assert flags == ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vp2intersect")  # FLAGS order
    m = protocol.Machine(cpu, family, flags, 2, "avx512 (16 lanes)")
    assert m.describe() == ("AMD EPYC 9R14 (family/model 25/17), 2 cores; flags: avx2 fma avx512f avx512bw avx512vl "
                            "avx512_vp2intersect")


def test_proc_stat_busy_ticks_leave_out_idle_and_iowait():
    assert protocol._proc_stat("cpu  10 2 3 100 5 1 1 0 0 0\ncpu0 1 1 1 1 1 1 1 1\n") == (17, 122)
    with pytest.raises(ValueError, match="no 'cpu' line"):
        protocol._proc_stat("intr 1 2 3\n")


def test_busy_fraction_is_others_cpu_time_over_wall_time_and_cores():
    # 150 ticks at 100 Hz = 1.5 s busy in 1 s of wall on 2 cores; 0.5 s of it was ours: others 1.0 s / 2 = 50%
    a = CpuReading(busy_ticks=1000, total_ticks=5000, own_seconds=1.0, wall=10.0)
    b = CpuReading(busy_ticks=1150, total_ticks=5200, own_seconds=1.5, wall=11.0)
    assert busy_fraction(a, b, cores=2, hz=100) == 0.5
    assert busy_fraction(a, CpuReading(1010, 5200, 1.5, 11.0), cores=2, hz=100) == 0.0  # clipped: all ours
    with pytest.raises(ValueError, match="readings out of order"):
        busy_fraction(b, a, cores=2, hz=100)


def test_a_quiet_reading_starts_the_run_and_a_busy_one_is_refused_before_it(monkeypatch):
    readings = iter([CpuReading(0, 0, 0.0, 0.0), CpuReading(2, 400, 0.0, 1.0), CpuReading(2, 400, 0.0, 1.0),
                     CpuReading(3, 800, 0.0, 2.0)])
    monkeypatch.setattr(protocol, "read_cpu", lambda pids=(): next(readings))
    monkeypatch.setattr(protocol.os, "sysconf", lambda name: 100)
    quiet = LoadMonitor(cores=2, probe_seconds=0.0).start()  # 0.02 s of 2 s: 1%
    assert quiet.before == 0.01 and quiet.stop() == 0.005 and not quiet.loaded
    assert quiet.describe().startswith("quiet; others used 1% of the cores before the run and 0% during it")

    readings = iter([CpuReading(0, 0, 0.0, 0.0), CpuReading(80, 400, 0.2, 1.0)])  # others: 0.6 s of 2 s = 30%
    monkeypatch.setattr(protocol, "read_cpu", lambda pids=(): next(readings))
    with pytest.raises(Busy, match=r"other processes used 30% of 2 cores \(threshold 10%.*--allow-loaded"):
        LoadMonitor(cores=2, probe_seconds=0.0).start()
    with pytest.raises(ValueError, match=r"threshold must be in \(0, 1\], got 0"):
        LoadMonitor(cores=2, threshold=0)


def test_a_machine_kept_busy_by_another_process_is_refused_or_marked_loaded(busy_machine):
    """A real spinning process on every core: the monitor sees the load, refuses, or runs marked 'loaded'."""
    with pytest.raises(Busy, match="the machine is busy"):
        LoadMonitor(probe_seconds=1.0).start()
    mon = LoadMonitor(probe_seconds=1.0, allow_loaded=True).start()
    mon.stop()
    assert mon.loaded and mon.describe().startswith("LOADED")


def test_a_time_is_reported_only_when_it_stands_clear_of_the_floor():
    # layer graph 2.0 ms, floor 1.0 ms (spread 0.02), K = 10: 0.1 ms per application, every round positive
    got = resolve([2.0, 2.02, 1.99], [1.0, 1.01, 0.99], k=10)  # rounds paired: nets 0.1, 0.101, 0.1
    assert got.resolved and (got.ms, got.low, got.high) == pytest.approx((0.1, 0.1, 0.101))
    assert got.floor_ms == 1.0 and got.text() == "0.100 (0.100-0.101)"
    # 1.03 against a floor of 1.0 that spreads 0.1: inside the noise, never a (possibly negative) number
    noisy = resolve([1.03, 0.95, 1.04], [1.0, 1.1, 0.98], k=16)
    assert not noisy.resolved and noisy.ms is None and noisy.text() == "< floor (K=16)"
    with pytest.raises(ValueError, match="paired rounds"):
        resolve([1.0], [1.0, 2.0], k=2)


def test_samples_give_median_and_spread():
    s = protocol.Samples((3.0, 1.0, 2.0, 10.0))
    assert (s.median, s.low, s.high) == (2.5, 1.0, 10.0)
    assert s.text(1) == "2.5 (1.0-10.0)"


def test_a_calibration_that_varied_past_the_threshold_marks_the_table_unsteady():
    mach = protocol.Machine("AMD EPYC", "26/2", ("avx512f",), 2, "avx512 (16 lanes)")

    class Quiet:
        def describe(self):
            return "quiet"

    steady = protocol.header("t", mach, Quiet(), protocol.Samples((300.0, 330.0, 390.0)), "intra_op=2")
    unsteady = protocol.header("t", mach, Quiet(), protocol.Samples((300.0, 330.0, 391.0)), "intra_op=2")
    assert "UNSTEADY" not in steady  # 390 / 300 = 1.30: at the threshold, not past it
    assert "- UNSTEADY: the calibration's slowest round took 1.30x its fastest (above 1.3x)" in unsteady
