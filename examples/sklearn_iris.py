#!/usr/bin/env python3
"""scikit-learn -> ONNX -> cartonstore pack -> serve -> tritonclient, end to end.

Trains a LogisticRegression and a RandomForest on iris, converts each to
ONNX with skl2onnx (zipmap off: probabilities as a tensor, which is what
cartonstore serves), packs each .onnx file into a carton with
`cartonstore pack`, adds it to a store, starts `cartonstore serve` on a
loopback port, loads both with tritonclient.http and checks that their
labels and probabilities are scikit-learn's.

    pip install 'cartonstore[onnx]' scikit-learn skl2onnx tritonclient[http]
    python examples/sklearn_iris.py [--workdir DIR]
"""

from __future__ import annotations

import argparse
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def cartonstore(*args: str) -> None:
    """A cartonstore command, as a user would type it."""
    subprocess.run([sys.executable, "-m", "cartonstore.cli", *args], check=True)


def to_onnx(model: object, path: Path) -> None:
    from skl2onnx import convert_sklearn
    from skl2onnx.common.data_types import FloatTensorType

    onnx_model = convert_sklearn(model, initial_types=[("X", FloatTensorType([None, 4]))],
                                 options={id(model): {"zipmap": False}})   # probabilities as a tensor
    path.write_bytes(onnx_model.SerializeToString())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", type=Path, help="where to write the models and the store (default: a temporary one)")
    args = ap.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="cartonstore-iris-"))
    work.mkdir(parents=True, exist_ok=True)

    from sklearn.datasets import load_iris
    from sklearn.ensemble import RandomForestClassifier
    from sklearn.linear_model import LogisticRegression

    X, y = load_iris(return_X_y=True)
    X = X.astype(np.float32)
    models = {"iris-lr": LogisticRegression(max_iter=500).fit(X, y),
              "iris-rf": RandomForestClassifier(n_estimators=20, max_depth=4, random_state=0).fit(X, y)}

    # 1. each model as an .onnx file, 2. each file as a carton, 3. in a store
    root = work / "store"
    for name, model in models.items():
        to_onnx(model, work / f"{name}.onnx")
        cartonstore("pack", str(work / f"{name}.onnx"), "-o", str(work / f"{name}.carton"), "--name", name)
        cartonstore("add", str(work / f"{name}.carton"), "--name", name, "--root", str(root), "--progress", "none")

    # 4. the daemon, on a loopback port
    port = free_port()
    daemon = subprocess.Popen([sys.executable, "-m", "cartonstore.cli", "serve", "--root", str(root),
                               "--socket", str(work / "cs.sock"), "--listen", f"127.0.0.1:{port}"])
    try:
        import tritonclient.http as triton

        client = triton.InferenceServerClient(f"127.0.0.1:{port}")
        deadline = time.monotonic() + 60
        while True:
            try:
                if client.is_server_ready():
                    break
            except Exception:  # noqa: BLE001 - not listening yet
                pass
            if time.monotonic() > deadline or daemon.poll() is not None:
                raise SystemExit("the daemon did not start")
            time.sleep(0.1)

        # 5. load each by name and ask it what scikit-learn answers
        worst = 0.0
        for name, model in models.items():
            client.load_model(name)
            x = triton.InferInput("X", list(X.shape), "FP32")
            x.set_data_from_numpy(X)
            result = client.infer(name, [x])
            labels, probabilities = result.as_numpy("label"), result.as_numpy("probabilities")
            if not np.array_equal(labels, model.predict(X)):
                raise SystemExit(f"{name}: labels differ from scikit-learn's")
            diff = float(np.abs(probabilities - model.predict_proba(X)).max())
            worst = max(worst, diff)
            print(f"{name}: {len(labels)} predictions equal scikit-learn's; probabilities within {diff:.1e}")
        if worst > 1e-6:
            raise SystemExit(f"probabilities differ from scikit-learn's by {worst:.1e} (more than 1e-6)")
        client.close()
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(30)
    print(f"ok: {', '.join(models)} served from {root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
