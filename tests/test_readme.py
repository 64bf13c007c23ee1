"""The README's 20-line example runs as written, in a fresh process and folder, and does what its comments say."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_readme_example_prunes_saves_and_exports(tmp_path):
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) == 2 and len(blocks[0].splitlines()) <= 22, "the README keeps one example of about 20 lines"
    check = (
        "\nimport numpy as np, tensorflow as tf\n"
        "kernels = [np.asarray(l.kernel) for l in final.layers]\n"
        "assert [round(float((k == 0).mean()), 2) for k in kernels] == [0.9, 0.9, 0.9], kernels\n"
        "loaded = keras.models.load_model('pruned.keras')\n"
        "np.testing.assert_allclose(loaded.predict(x[:8], verbose=0), model.predict(x[:8], verbose=0), rtol=1e-6)\n"
        "saved = tf.saved_model.load('saved')  # keep the object: its functions hold its variables\n"
        "served = saved.serve(x[:8]).numpy()\n"
        "np.testing.assert_allclose(served, final.predict(x[:8], verbose=0), rtol=1e-5, atol=1e-6)\n"
        "print('README example OK', os.path.getsize('pruned.tflite'))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run([sys.executable, "-c", "import os\n" + blocks[0] + check], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "README example OK" in proc.stdout
    assert len((ROOT / "README.md").read_text().splitlines()) <= 150


@pytest.mark.slow
def test_the_readme_oneshot_example_runs_and_prunes_half(tmp_path):
    """The second example (What is inside: pruning after training) as written, then its claims checked."""
    import textwrap

    text = (ROOT / "README.md").read_text()
    block = textwrap.dedent(re.findall(r"```python\n(.*?)```", text, re.S)[1])
    assert len(block.splitlines()) <= 12
    check = (
        "\nimport numpy as np\n"
        "from prune.core.targets import mask_targets\n"
        "for m, want in ((pruned, 0.5), (nm, 0.5)):\n"
        "    for t in mask_targets(m):\n"
        "        keep = np.asarray(t.keep)\n"
        "        assert (~keep).mean() == want and np.all(np.asarray(t.weight)[~keep] == 0.0), t.key\n"
        "print('oneshot example OK')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run([sys.executable, "-c", block + check], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "oneshot example OK" in proc.stdout
