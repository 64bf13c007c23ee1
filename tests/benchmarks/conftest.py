"""Fixtures of the benchmark tests: a machine kept busy, for the protocol's refusal."""

import os
import subprocess
import sys

import pytest


@pytest.fixture
def busy_machine():
    """One spinning Python process per usable core while the test runs; all killed afterwards."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    spin = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(cores)]
    try:
        yield spin
    finally:
        for p in spin:
            p.kill()
            p.wait()
