"""The one benchmark protocol every script in ``benchmarks/`` follows.

A speed figure means nothing without the machine it ran on, the load beside it and what dense reaches in the
same run. This module gives every script the same answers:

* **The machine** (:func:`machine`): CPU model, the flags that decide a kernel's path (``avx2``, ``avx512f``,
  ``avx512_fp16``, ``avx512_vp2intersect``, ``amx_tile``, ``asimd``...), the cores this process may use, and
  the native kernels' vector path.
* **Threads, fixed and stated** (:func:`fix_tf_threads`): TensorFlow's intra-op threads = the usable cores,
  inter-op = 1, set before TensorFlow runs anything.
* **The load** (:class:`LoadMonitor`): the CPU time other processes took during the run, from ``/proc/stat``
  less this process's own (and its children's) CPU time, plus the load averages before and after. A machine
  busier than :data:`BUSY_FRACTION` of its cores before the run is refused (:class:`Busy`) unless the script
  is told ``--allow-loaded``, and a table made on a busy machine says "loaded" in its header.
* **Dense calibration** (:func:`dense_gemm_gflops`): TensorFlow's dense ``[256, 1024] x [1024, 1024]`` GEMM in
  GFLOPS, measured in the same run and printed above every table, so a reader knows what "x dense" is
  relative to. (Measured dense GEMMs differ by 2x between the CPUs this project has run on.)
* **Times** (:func:`per_application`): time per application inside one compiled graph, as ``(T_layer(K) -
  T_floor(K)) / K``, where the floor graph reads the same K inputs and applies nothing. K grows until the
  difference stands clear of the floor's own spread, so no time comes out negative or inside the noise; a
  point that never does is reported as unresolved (``None``), never as a number.
* **Spread** (:class:`Samples`): medians of interleaved rounds with their min and max.
* **Peers at their defaults**: a script runs torch and scipy as a user would (torch's own thread count and
  OpenMP wait policy). Any other setting is a second, labelled row.

Scripts print :func:`header` above their table; ``tests/benchmarks/test_protocol.py`` checks the arithmetic
on fixed readings and the refusal on a machine made busy by a spinning child process.
"""

from __future__ import annotations

import os
import platform
import sys
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

__all__ = [
    "BUSY_FRACTION",
    "FLAGS",
    "Busy",
    "CpuReading",
    "LoadMonitor",
    "Machine",
    "PerApplication",
    "REFUSED",
    "Samples",
    "add_arguments",
    "busy_fraction",
    "dense_gemm_gflops",
    "fix_tf_threads",
    "forward_and_train",
    "header",
    "interleaved",
    "machine",
    "monitor_from",
    "per_application",
    "read_cpu",
    "resolve",
    "start_or_refuse",
    "time_calls",
]

BUSY_FRACTION = 0.10
"""Other processes may use at most this fraction of the usable cores' time, before and during a run."""

UNSTEADY_SPREAD = 1.3
"""Slowest over fastest round of the dense calibration above which a table is marked unsteady. On a virtual
machine the host can slow these cores (its other guests, its clock) with no process of ours or anyone's
visible in ``/proc/stat``: on 2026-12-02 an AMD EPYC guest, quiet by that measure, gave calibration rounds of
218-348 GFLOPS in one run and 290-362 in another."""

FLAGS = (
    "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "avx512_fp16",
    "avx512_vp2intersect", "amx_tile", "amx_bf16", "asimd", "sve",
)
"""The CPU flags a table states: those that decide which kernel path runs, and how fast dense is."""


class Busy(RuntimeError):
    """The machine is busy: a table measured now would measure the load, not the code."""


# -- the machine ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Machine:
    """What a table's numbers hold on.

    Attributes:
        cpu: The CPU model name (``/proc/cpuinfo``; KVM guests may report a generic name, so ``family``/``model``).
        family: CPU family and model numbers, ``"6/167"`` (x86), or ``""``.
        flags: Those of :data:`FLAGS` the CPU has.
        cores: CPUs this process may run on (its affinity).
        native: The native kernels' vector path (``prune.native.status()``), or why they are off.
    """

    cpu: str
    family: str
    flags: tuple[str, ...]
    cores: int
    native: str = ""

    def describe(self) -> str:
        fam = f" (family/model {self.family})" if self.family else ""
        return f"{self.cpu}{fam}, {self.cores} cores; flags: {' '.join(self.flags) or 'none of ' + ', '.join(FLAGS)}"


def _cpuinfo(text: str) -> tuple[str, str, tuple[str, ...]]:
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if ":" in line:
            k, v = line.split(":", 1)
            fields.setdefault(k.strip(), v.strip())
    cpu = fields.get("model name") or fields.get("Model name") or fields.get("Hardware") or platform.processor() or "unknown"
    family = f"{fields['cpu family']}/{fields['model']}" if "cpu family" in fields and "model" in fields else ""
    have = set((fields.get("flags") or fields.get("Features") or "").split())
    return cpu, family, tuple(f for f in FLAGS if f in have)


def machine(native: bool = True) -> Machine:
    """The machine this process runs on; ``native=True`` also asks ``prune.native`` for its vector path.

    ``native=True`` loads the native kernels, which imports TensorFlow: a process that must stay free of it (the
    runner's parent in ``runner_workers.py``) passes ``native=False``.
    """
    try:
        with open("/proc/cpuinfo") as f:
            cpu, family, flags = _cpuinfo(f.read())
    except OSError:
        cpu, family, flags = platform.processor() or "unknown", "", ()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    path = ""
    if native:
        try:
            import prune.native as pn

            st = pn.status()
            path = (f"{st.vector} (flags `{st.flags}`)" if st.available
                    else f"off: {st.reason}")
        except Exception as e:  # the table still runs; it says why there is no native path
            path = f"unavailable ({type(e).__name__}: {e})"
    return Machine(cpu, family, flags, cores, path)


def fix_tf_threads(intra: int | None = None, inter: int = 1) -> tuple[int, int]:
    """Fix TensorFlow's thread pools (intra-op = ``intra`` or the usable cores, inter-op = ``inter``).

    Must run before TensorFlow executes anything; returns the pair TensorFlow reports afterwards.

    Raises:
        RuntimeError: TensorFlow has run already and its pools differ from the ones asked for.
    """
    import tensorflow as tf

    intra = intra or machine(native=False).cores
    try:
        tf.config.threading.set_intra_op_parallelism_threads(intra)
        tf.config.threading.set_inter_op_parallelism_threads(inter)
    except RuntimeError:
        pass  # already initialised: checked below
    got = (tf.config.threading.get_intra_op_parallelism_threads(), tf.config.threading.get_inter_op_parallelism_threads())
    if got != (intra, inter):
        raise RuntimeError(f"TensorFlow's threads are {got}, not (intra={intra}, inter={inter}): call fix_tf_threads first")
    return got


# -- the load ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CpuReading:
    """One reading: the whole machine's busy and total CPU ticks, this process tree's CPU seconds, a wall time."""

    busy_ticks: int
    total_ticks: int
    own_seconds: float
    wall: float


def _proc_stat(text: str) -> tuple[int, int]:
    """``(busy, total)`` ticks from the ``cpu`` line of ``/proc/stat`` (idle and iowait are not busy)."""
    for line in text.splitlines():
        parts = line.split()
        if parts and parts[0] == "cpu":
            ticks = [int(x) for x in parts[1:9]]  # user nice system idle iowait irq softirq steal
            idle = ticks[3] + ticks[4]
            return sum(ticks) - idle, sum(ticks)
    raise ValueError("no 'cpu' line in /proc/stat")


def _own_seconds(pids: Iterable[int] = ()) -> float:
    t = os.times()
    own = t.user + t.system + t.children_user + t.children_system
    hz = os.sysconf("SC_CLK_TCK")
    for pid in pids:  # helpers not yet waited for (a torch peer): their CPU is ours, not load
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            own += (int(fields[11]) + int(fields[12])) / hz
        except (OSError, IndexError, ValueError):
            pass
    return own


def read_cpu(pids: Iterable[int] = ()) -> CpuReading:
    """A :class:`CpuReading` now; ``pids`` are helper processes whose CPU time counts as this run's own."""
    with open("/proc/stat") as f:
        busy, total = _proc_stat(f.read())
    return CpuReading(busy, total, _own_seconds(pids), time.monotonic())


def busy_fraction(before: CpuReading, after: CpuReading, cores: int, hz: int | None = None) -> float:
    """The fraction of ``cores`` that *other* processes kept busy between two readings.

    ``(busy ticks / hz - own CPU seconds) / (wall seconds * cores)``, clipped to [0, 1]. Ticks count every CPU
    of the machine; a process limited to fewer cores than the machine has still sees load on the others (a
    conservative reading).

    Raises:
        ValueError: readings out of order.
    """
    hz = hz or os.sysconf("SC_CLK_TCK")
    wall = after.wall - before.wall
    if wall <= 0 or after.total_ticks < before.total_ticks:
        raise ValueError(f"readings out of order: wall {wall:.3f} s, ticks {before.total_ticks} -> {after.total_ticks}")
    others = (after.busy_ticks - before.busy_ticks) / hz - (after.own_seconds - before.own_seconds)
    return min(1.0, max(0.0, others / (wall * cores)))


@dataclass
class LoadMonitor:
    """The load before and during a run; :meth:`start` refuses a busy machine.

    Args:
        cores: Usable cores (default: this process's affinity).
        threshold: Refuse or mark "loaded" above this fraction of the cores kept busy by others.
        allow_loaded: Run anyway on a busy machine, and say "loaded" in the table.
        probe_seconds: How long :meth:`start` watches the idle machine.
        pids: Helper processes whose CPU counts as the run's own.
    """

    cores: int = 0
    threshold: float = BUSY_FRACTION
    allow_loaded: bool = False
    probe_seconds: float = 1.0
    pids: list[int] = field(default_factory=list)
    before: float | None = None
    during: float | None = None
    loadavg_before: str = ""
    loadavg_after: str = ""
    _start: CpuReading | None = None

    def __post_init__(self) -> None:
        self.cores = self.cores or machine(native=False).cores
        if not 0.0 < self.threshold <= 1.0:
            raise ValueError(f"threshold must be in (0, 1], got {self.threshold!r}")

    def start(self) -> "LoadMonitor":
        """Watch the machine for ``probe_seconds`` with this process idle, then start the run's reading.

        Raises:
            Busy: others kept more than ``threshold`` of the cores busy and ``allow_loaded`` is False.
        """
        self.loadavg_before = _loadavg()
        a = read_cpu(self.pids)
        time.sleep(self.probe_seconds)
        b = read_cpu(self.pids)
        self.before = busy_fraction(a, b, self.cores)
        if self.before > self.threshold and not self.allow_loaded:
            raise Busy(
                f"the machine is busy: other processes used {self.before:.0%} of {self.cores} cores "
                f"(threshold {self.threshold:.0%}; load average {self.loadavg_before}). A table measured now "
                "measures the load, not the code: stop the other work (tests, builds, sweeps), or pass "
                "--allow-loaded to run anyway with the table marked 'loaded'"
            )
        self._start = read_cpu(self.pids)
        return self

    def stop(self) -> float:
        """The fraction of the cores others used during the run (also kept in :attr:`during`)."""
        if self._start is None:
            raise RuntimeError("LoadMonitor.stop() before start()")
        self.during = busy_fraction(self._start, read_cpu(self.pids), self.cores)
        self.loadavg_after = _loadavg()
        return self.during

    @property
    def loaded(self) -> bool:
        """Whether the table must say "loaded": busy before or during the run."""
        return any(x is not None and x > self.threshold for x in (self.before, self.during))

    def describe(self) -> str:
        during = "not measured" if self.during is None else f"{self.during:.0%}"
        state = "LOADED: these times measure the load as well as the code" if self.loaded else "quiet"
        return (f"{state}; others used {self.before:.0%} of the cores before the run and {during} during it "
                f"(threshold {self.threshold:.0%}); load average {self.loadavg_before} before, "
                f"{self.loadavg_after or '-'} after")


def _loadavg() -> str:
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "unknown"


# -- times ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Samples:
    """Times of one thing over interleaved rounds (ms): the median and its spread."""

    values: tuple[float, ...]

    @property
    def median(self) -> float:
        return float(statistics.median(self.values))

    @property
    def low(self) -> float:
        return float(min(self.values))

    @property
    def high(self) -> float:
        return float(max(self.values))

    def text(self, digits: int = 3) -> str:
        """``"median (min-max)"``."""
        return f"{self.median:.{digits}f} ({self.low:.{digits}f}-{self.high:.{digits}f})"


def time_calls(fn: Callable[[], Any], min_ms: float) -> float:
    """Mean ms of one call of ``fn``, calling it back to back for at least ``min_ms`` (after one warm call)."""
    fn()
    n, t0 = 0, time.perf_counter()
    while True:
        fn()
        n += 1
        t = (time.perf_counter() - t0) * 1e3
        if t >= min_ms:
            return t / n


def interleaved(fns: Mapping[str, Callable[[], Any]], rounds: int, min_ms: float, seed: int = 0) -> dict[str, Samples]:
    """Each of ``fns`` timed once per round (:func:`time_calls`), in a fresh random order every round."""
    import random

    if rounds < 1:
        raise ValueError(f"rounds must be a positive integer, got {rounds!r}")
    order, rng = list(fns), random.Random(seed)
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        rng.shuffle(order)
        for k in order:
            times[k].append(time_calls(fns[k], min_ms))
    return {k: Samples(tuple(v)) for k, v in times.items()}


@dataclass(frozen=True)
class PerApplication:
    """Time per application of a layer in a compiled graph, net of the graph's floor.

    Attributes:
        ms: Median of ``(T_layer - T_floor) / K`` over rounds; ``None`` when unresolved.
        low, high: Its min and max over rounds.
        k: Applications per graph call.
        floor_ms: The floor graph's median time per call (reading the K inputs, applying nothing).
        resolved: Whether the layer's graph stood clear of the floor's spread at this K.
    """

    ms: float | None
    low: float | None
    high: float | None
    k: int
    floor_ms: float
    resolved: bool

    def text(self, digits: int = 3) -> str:
        if not self.resolved or self.ms is None:
            return f"< floor (K={self.k})"
        return f"{self.ms:.{digits}f} ({self.low:.{digits}f}-{self.high:.{digits}f})"


def resolve(layer_ms: Sequence[float], floor_ms: Sequence[float], k: int, margin: float = 3.0) -> PerApplication:
    """Net time per application from paired rounds of a K-application graph and its floor graph.

    Resolved when the layer graph's median exceeds the floor's median by ``margin`` times the floor's spread
    (max - min) and by at least 2% of the floor: then every round's net time is positive. Pure arithmetic
    (``tests/benchmarks/test_protocol.py`` checks it on fixed numbers).
    """
    if len(layer_ms) != len(floor_ms) or not layer_ms:
        raise ValueError(f"layer_ms and floor_ms must be paired rounds, got {len(layer_ms)} and {len(floor_ms)}")
    f_med = statistics.median(floor_ms)
    spread = max(floor_ms) - min(floor_ms)
    gap = statistics.median(layer_ms) - f_med
    nets = [(a - b) / k for a, b in zip(layer_ms, floor_ms)]
    resolved = gap > margin * spread and gap > 0.02 * f_med and min(nets) > 0
    if not resolved:
        return PerApplication(None, None, None, k, f_med, False)
    return PerApplication(float(statistics.median(nets)), float(min(nets)), float(max(nets)), k, f_med, True)


def per_application(
    apply: Callable[[Any], Any],
    pool: Sequence[Any],
    rounds: int = 7,
    min_ms: float = 20.0,
    k_start: int = 8,
    k_max: int = 256,
) -> PerApplication:
    """Time per application of ``apply`` in one ``tf.function`` over K distinct inputs, net of the floor.

    Input ``i`` is ``pool[i % len(pool)] + i`` (a fresh value each time, so no application can be merged with
    another as a common subexpression). The layer graph sums ``reduce_sum(apply(x_i))``; the floor graph sums
    ``reduce_sum(x_i)``: the same dispatch, input arithmetic and sums, without the layer. K starts at
    ``k_start`` and quadruples until :func:`resolve` resolves the point or K would pass ``k_max``.
    """
    import tensorflow as tf

    pool = list(pool)
    if not pool:
        raise ValueError("pool must hold at least one input tensor")

    def inputs(k: int) -> list[Any]:
        return [pool[i % len(pool)] + tf.constant(float(i), pool[0].dtype) for i in range(k)]

    k = k_start
    while True:
        layer_fn = tf.function(lambda k=k: tf.add_n([tf.reduce_sum(tf.cast(apply(x), tf.float32)) for x in inputs(k)]))
        floor_fn = tf.function(lambda k=k: tf.add_n([tf.reduce_sum(tf.cast(x, tf.float32)) for x in inputs(k)]))
        layer_fn().numpy(), floor_fn().numpy()  # trace
        fns = {"layer": lambda: layer_fn().numpy(), "floor": lambda: floor_fn().numpy()}
        got = interleaved(fns, rounds, min_ms, seed=k)
        out = resolve(got["layer"].values, got["floor"].values, k)
        if out.resolved or k * 4 > k_max:
            return out
        k *= 4


def forward_and_train(layer: Any, pool: Sequence[Any], rounds: int = 7, min_ms: float = 20.0,
                      k_max: int = 256) -> tuple[PerApplication, PerApplication]:
    """:func:`per_application` of ``layer``'s forward pass and of one training step of it alone.

    The step is the mean square of the layer's output, its gradients, and an Adam update (learning rate 1e-4;
    the optimizer's slots built before timing).
    """
    import keras
    import tensorflow as tf

    optimizer = keras.optimizers.Adam(1e-4)
    optimizer.build(layer.trainable_variables)

    def step(x: Any) -> Any:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(layer(x)))
        grads = tape.gradient(loss, layer.trainable_variables)
        optimizer.apply(grads, layer.trainable_variables)
        return loss

    fwd = per_application(layer, pool, rounds=rounds, min_ms=min_ms, k_max=k_max)
    return fwd, per_application(step, pool, rounds=rounds, min_ms=min_ms, k_max=k_max)


def dense_gemm_gflops(batch: int = 256, size: int = 1024, rounds: int = 7, min_ms: float = 50.0) -> Samples:
    """TensorFlow's dense ``[batch, size] x [size, size]`` matmul in GFLOPS (one per round), in a ``tf.function``.

    Eight distinct inputs per call, so no result is reused from cache; ``2 * batch * size^2`` flops each.
    """
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    w = tf.constant(rng.standard_normal((size, size)).astype(np.float32))
    xs = [tf.constant(rng.standard_normal((batch, size)).astype(np.float32)) for _ in range(8)]
    fn = tf.function(lambda: tf.add_n([tf.reduce_sum(tf.matmul(x, w)) for x in xs]))
    fn().numpy()
    got = interleaved({"gemm": lambda: fn().numpy()}, rounds, min_ms)["gemm"]
    flops = 2.0 * batch * size * size * len(xs)
    return Samples(tuple(flops / (ms * 1e-3) / 1e9 for ms in got.values))


def header(title: str, mach: Machine, load: LoadMonitor, gemm: Samples | None, threads: str, extra: Iterable[str] = ()) -> str:
    """The lines every table starts with: what, where, with which threads, under what load, against what dense."""
    lines = [f"# {title}", "", f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} under `benchmarks/protocol.py`.", "",
             f"- CPU: {mach.describe()}.", f"- Native kernels: {mach.native or 'not used'}.", f"- Threads: {threads}.",
             f"- Load: {load.describe()}."]
    if gemm is not None:
        lines.append(f"- Dense calibration: TensorFlow's [256, 1024] x [1024, 1024] GEMM at {gemm.median:.0f} GFLOPS "
                     f"(min {gemm.low:.0f}, max {gemm.high:.0f} over {len(gemm.values)} rounds) in this run; "
                     "every 'x dense' below is relative to this machine's dense.")
        if gemm.high > UNSTEADY_SPREAD * gemm.low:
            lines.append(f"- UNSTEADY: the calibration's slowest round took {gemm.high / gemm.low:.2f}x its fastest "
                         f"(above {UNSTEADY_SPREAD}x) with no other process using the CPU: the host varied these "
                         "cores' speed during the run, so single rounds are unreliable; ratios of medians taken side "
                         "by side hold better than absolute times, and the CSV's min-max shows how far.")
    lines.extend(f"- {e}" for e in extra)
    return "\n".join(lines) + "\n"


def add_arguments(parser: Any) -> None:
    """The protocol's flags, the same in every script: ``--allow-loaded`` and ``--busy-threshold``."""
    parser.add_argument("--allow-loaded", action="store_true",
                        help="run on a busy machine anyway; the table's header then says 'loaded'")
    parser.add_argument("--busy-threshold", type=float, default=BUSY_FRACTION,
                        help=f"fraction of the cores others may use before the run is refused (default {BUSY_FRACTION})")


def monitor_from(args: Any, **kwargs: Any) -> LoadMonitor:
    """A started :class:`LoadMonitor` from :func:`add_arguments`' flags; raises :class:`Busy` on a busy machine."""
    return LoadMonitor(threshold=args.busy_threshold, allow_loaded=args.allow_loaded, **kwargs).start()


REFUSED = 3
"""The exit status of a script that refused a busy machine."""


def start_or_refuse(args: Any, **kwargs: Any) -> LoadMonitor | None:
    """:func:`monitor_from`, or ``None`` after printing ``refused: <why>`` to stderr on a busy machine.

    Every script does ``load = protocol.start_or_refuse(args)`` and, on ``None``, exits with :data:`REFUSED`
    before any work (and, where it can, before importing TensorFlow).
    """
    try:
        return monitor_from(args, **kwargs)
    except Busy as e:
        print(f"refused: {e}", file=sys.stderr)
        return None

