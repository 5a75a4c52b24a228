"""The examples under examples/ run as a user would run them: real
processes (the CLI, `cartonstore serve`, its runners), nothing left behind."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from kit.inferkit import runner_pids

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_scikit_learn_example_end_to_end(short_tmp: Path) -> None:
    """LogisticRegression and RandomForest on iris, packed from their .onnx
    files alone, served, and answered through tritonclient.http: labels
    equal to scikit-learn's, probabilities within 1e-6 (the script checks)."""
    done = subprocess.run([sys.executable, str(REPO / "examples" / "sklearn_iris.py"), "--workdir", str(short_tmp)],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    lines = done.stdout.splitlines()
    for name in ("iris-lr", "iris-rf"):
        line = next(x for x in lines if x.startswith(f"{name}: "))
        assert "150 predictions equal scikit-learn's" in line
        assert float(line.rsplit("within ", 1)[1]) <= 1e-6
    assert lines[-1].startswith("ok: iris-lr, iris-rf served from")
    assert not runner_pids(short_tmp / "store")
