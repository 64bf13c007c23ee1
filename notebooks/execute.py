"""Execute the notebooks on the committed tables and save them with their outputs (``make notebooks``).

The committed notebooks carry their outputs, so that they read on a repository page;
``tests/test_notebooks.py`` executes each again and checks that its text outputs are the committed ones
(:func:`text_outputs`: streams and plain-text results, with memory addresses masked; figures are checked
to be there, not pixel for pixel, since rasterisation differs in the last bits between CPUs).

    .venv/bin/python notebooks/execute.py [NOTEBOOK ...]
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent
NOTEBOOKS = sorted(HERE.glob("[0-9][0-9]_*.ipynb"))
_ADDRESS = re.compile(r" at 0x[0-9a-f]+")


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


def main(argv: list[str]) -> int:
    for path in [Path(a) for a in argv] or NOTEBOOKS:
        nb = execute(path)
        for cell in nb.cells:  # execution metadata holds wall-clock times: leave it out of the committed file
            cell.get("metadata", {}).pop("execution", None)
        nbformat.write(nb, path)
        print(f"{path.name}: {sum(len(c.get('outputs', [])) for c in nb.cells)} outputs, {path.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
