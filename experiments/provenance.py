"""Where and with what a run ran: versions, git state, CPU, host.

Versions are read with :mod:`importlib.metadata`, never by importing the
package: importing tensorflow_model_optimization would switch the whole
process to legacy Keras.
"""

from __future__ import annotations

import importlib.metadata
import platform
import socket
import subprocess
from pathlib import Path

__all__ = ["versions", "git_state", "cpu_model", "hostname"]

_PACKAGES = {
    "tensorflow_version": "tensorflow",
    "keras_version": "keras",
    "tf_keras_version": "tf-keras",
    "tfmot_version": "tensorflow-model-optimization",
    "numpy_version": "numpy",
}


def versions() -> dict[str, str]:
    """Installed versions of TensorFlow, Keras, tf-keras, tfmot, numpy and Python."""
    out = {}
    for key, dist in _PACKAGES.items():
        try:
            out[key] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[key] = ""
    out["python_version"] = platform.python_version()
    return out


def git_state(where: Path | None = None) -> tuple[str, bool]:
    """``(commit, dirty)`` of the repository containing ``where`` (this package by default).

    ``("", False)`` outside a git checkout.
    """
    cwd = Path(where) if where else Path(__file__).resolve().parent
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return "", False
    return commit, bool(status.strip())


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo, else :func:`platform.processor`."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def hostname() -> str:
    """This machine's host name."""
    return socket.gethostname()
