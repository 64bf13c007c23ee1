"""The fast tests on every supported CPython (3.11-3.13; see setup.cfg's python_requires): ``make test-pythons``.

Each session makes its own virtual environment, installs the project with its development extras
(and the figure constraints) and runs ``pytest -m "not slow"``. ``make test`` stays on the default
Python; an interpreter that is not installed is skipped (``nox`` says so).
"""

from __future__ import annotations

import nox

PYTHONS = ["3.11", "3.12", "3.13"]

nox.options.sessions = ["tests"]
nox.options.error_on_missing_interpreters = False
nox.options.reuse_existing_virtualenvs = True


@nox.session(python=PYTHONS)
def tests(session: nox.Session) -> None:
    """``pytest -m "not slow"`` (arguments after ``--`` replace the defaults)."""
    session.install("--quiet", "-e", ".[dev]", "-c", "constraints/figures.txt")
    session.run("python", "-c", "import prune, sys; print(sys.version.split()[0], prune.native.status())")
    args = session.posargs or ["-q", "-n", "2", "--dist", "worksteal", "-m", "not slow"]
    session.run("python", "-m", "pytest", *args, env={"TF_CPP_MIN_LOG_LEVEL": "3"})
