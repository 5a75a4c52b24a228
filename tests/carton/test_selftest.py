"""A carton's own [[self_test]]s: the comparison (pure), and real runs
through real runner processes: on load in a real daemon (a failing model
never becomes READY; a reload to a failing version keeps the old one
serving), on POST .../selftest, and by `cartonstore selftest` with no
daemon."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tomli
import tomli_w
from conftest import short_dir
from kit.daemonkit import DaemonProcess, unix_session, wait_for
from kit.inferkit import runner_pids

from cartonstore.carton.selftest import compare
from cartonstore.client.infer import InferClient

MAIN = '''
import numpy as np


class Doubler:
    def infer_with_tensors(self, tensors):
        return {"y": tensors["x"] * np.float32(2), "s_out": tensors["s"]}


def get_model():
    return Doubler()
'''
X = np.array([[1.5, -2.0, 3.25], [0.0, 1e-3, 7.0]], dtype=np.float32)
STRINGS = ["one", "dos 💖", ""]


def doubler_carton(dest: Path, *, expected_y: np.ndarray | None = None, tests: int = 1) -> Path:
    """A python-runner carton whose self-tests send x and s and expect
    ``expected_y`` (default: the right answer, 2x) and s back."""
    y = X * 2 if expected_y is None else expected_y
    (dest / "model").mkdir(parents=True)
    (dest / "tensor_data").mkdir()
    (dest / "model" / "main.py").write_text(MAIN)
    toml = {
        "spec_version": 1, "model_name": "doubler",
        "input": [{"name": "x", "dtype": "float32", "shape": ["n", 3]}, {"name": "s", "dtype": "string", "shape": "*"}],
        "output": [{"name": "y", "dtype": "float32", "shape": ["n", 3]},
                   {"name": "s_out", "dtype": "string", "shape": "*"}],
        "self_test": [{"name": f"doubles-{i}", "inputs": {"x": "@tensor_data/x", "s": "@tensor_data/s"},
                       "expected_out": {"y": "@tensor_data/y", "s_out": "@tensor_data/s"}} for i in range(tests)],
        "runner": {"runner_name": "python", "required_framework_version": ">=3.8", "runner_compat_version": 1,
                   "opts": {"entrypoint_package": "main", "entrypoint_fn": "get_model"}},
    }
    if not tests:
        del toml["self_test"]
    (dest / "carton.toml").write_text(tomli_w.dumps(toml))
    index = {"tensor": [
        {"name": "x", "dtype": "float32", "shape": list(X.shape), "file": "x.bin"},
        {"name": "y", "dtype": "float32", "shape": list(y.shape), "file": "y.bin"},
        {"name": "s", "dtype": "string", "shape": [3], "file": "s.toml"},
    ]}
    (dest / "tensor_data" / "index.toml").write_text(tomli_w.dumps(index))
    (dest / "tensor_data" / "x.bin").write_bytes(X.astype("<f4").tobytes())
    (dest / "tensor_data" / "y.bin").write_bytes(y.astype("<f4").tobytes())
    (dest / "tensor_data" / "s.toml").write_text(tomli_w.dumps({"data": STRINGS}))
    return dest


# -- the comparison ----------------------------------------------------------------


def test_compare_names_the_output_the_shapes_and_the_largest_difference() -> None:
    want = {"y": np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)}
    assert compare(want, {"y": want["y"] + 1e-7}, 1e-5, 1e-8) == []
    (m,) = compare(want, {"y": np.array([[1.0, 2.0], [3.0, 4.5]], np.float32)}, 1e-5, 1e-8)
    assert (m["output"], m["index"], m["max_abs_diff"], m["shape"]) == ("y", [1, 1], 0.5, [2, 2])
    assert "output 'y' differs in 1 element(s), worst by 0.5 at [1, 1]" in m["problem"]
    assert compare(want, {"y": want["y"] + 0.4}, 0.0, 0.5) == []      # tolerances as given
    (m,) = compare(want, {"y": np.zeros((4,), np.float32)}, 1e-5, 1e-8)
    assert m["problem"] == "output 'y' has shape [4], expected [2, 2]"
    (m,) = compare(want, {}, 1e-5, 1e-8)
    assert m["problem"] == "output 'y' is missing from the answer"
    nan = {"y": np.array([np.nan, 1.0, np.inf])}
    assert compare(nan, {"y": np.array([np.nan, 1.0, np.inf])}, 1e-5, 1e-8) == []
    (m,) = compare(nan, {"y": np.array([0.0, 1.0, np.inf])}, 1e-5, 1e-8)
    assert m["index"] == [0] and m["max_abs_diff"] == float("inf")
    # the element that fails is named, not the one with the largest absolute difference
    (m,) = compare({"y": np.array([1e6, 1.0])}, {"y": np.array([1e6 + 5, 2.0])}, 1e-5, 1e-8)
    assert m["index"] == [1] and m["mismatched"] == 1
    # integers exactly, even where float64 would round them; dtypes must match
    big = np.array([2**53], np.int64)
    assert compare({"y": big}, {"y": big + 1}, 1.0, 1.0)[0]["index"] == [0]
    (m,) = compare({"y": np.ones(2, np.float32)}, {"y": np.ones(2, np.int64)}, 1e-5, 1e-8)
    assert m["problem"] == "output 'y' is int64, expected float32"


def test_compare_strings_exactly_bytes_against_str() -> None:
    want = {"s": np.array(["a", "b 💖"], dtype=object)}
    assert compare(want, {"s": np.array([b"a", "b 💖".encode()], dtype=object)}, 1e-5, 1e-8) == []
    (m,) = compare(want, {"s": np.array([b"a", b"b"], dtype=object)}, 1e-5, 1e-8)
    assert m["index"] == [1] and "output 's' differs at [1]: 'b', expected 'b 💖'" in m["problem"]


# -- through a daemon ---------------------------------------------------------------


def post(d: DaemonProcess, path: str, doc: object) -> tuple[int, dict]:
    async def go() -> tuple[int, dict]:
        async with unix_session(d.socket_path) as s:
            r = await s.post(path, json=doc)
            return r.status, await r.json()
    return asyncio.run(go())


def load(d: DaemonProcess, name: str, source: Path) -> tuple[int, dict]:
    return post(d, f"/v2/repository/models/{name}/load", {"parameters": {"source": str(source)}})


def index(d: DaemonProcess) -> dict[str, dict]:
    _status, rows = post(d, "/v2/repository/index", {})
    return {row["name"]: row for row in rows}


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[DaemonProcess, Path]]:
    with short_dir() as base:
        d = DaemonProcess(base / "root", listen=None).start()
        try:
            yield d, base
        finally:
            d.stop()
        assert wait_for(lambda: not runner_pids(d.root), 10), runner_pids(d.root)


def test_a_model_that_passes_loads_and_selftest_reports_each_test(served) -> None:
    d, base = served
    status, answer = load(d, "good", doubler_carton(base / "good", tests=2))
    assert status == 200, answer
    status, report = post(d, "/v2/models/good/selftest", {})
    assert status == 200 and report["passed"] is True, report
    assert [t["name"] for t in report["tests"]] == ["doubles-0", "doubles-1"]
    assert report["summary"] == "2 self-test(s) passed" and report["rtol"] == 1e-5
    status, report = post(d, "/v2/models/good/selftest", {"rtol": 0.1, "atol": 0})
    assert status == 200 and (report["rtol"], report["atol"]) == (0.1, 0.0)
    with InferClient(d.socket_path) as c:
        report = c.selftest("good", atol=0.5)
        assert report["passed"] and report["atol"] == 0.5 and len(report["tests"]) == 2
    for doc, fragment in (({"rtol": -1}, "rtol: expected a number >= 0"), ({"tol": 1}, "unknown field(s)"),
                          ({"atol": "x"}, "atol: expected a number >= 0")):
        status, answer = post(d, "/v2/models/good/selftest", doc)
        assert status == 400 and fragment in answer["error"], answer
    status, answer = post(d, "/v2/models/nope/selftest", {})
    assert status == 404 and "Request for unknown model: 'nope' is not found" in answer["error"]


def test_a_model_that_fails_never_becomes_ready(served) -> None:
    d, base = served
    wrong = X * 2
    wrong[1, 2] += 0.5
    before = set(runner_pids(d.root))
    status, answer = load(d, "bad", doubler_carton(base / "bad", expected_y=wrong))
    assert status == 400, answer
    assert answer["error"].startswith("failed to load 'bad': self-test failed, so the model was not made ready: "
                                      "1 of 1 self-test(s) "
                                      "failed: doubles-0: output 'y' differs in 1 element(s), worst by 0.5 at [1, 2]"), answer
    (test,) = answer["selftest"]["tests"]
    assert test["mismatches"][0]["index"] == [1, 2] and test["mismatches"][0]["max_abs_diff"] == 0.5
    row = index(d)["bad"]
    assert row["state"] == "UNAVAILABLE" and "self-test failed" in row["reason"]
    assert set(runner_pids(d.root)) == before     # its runner was stopped
    status, answer = post(d, "/v2/models/bad/selftest", {})
    assert status == 400 and "not ready" in answer["error"]


def test_a_reload_to_a_failing_version_keeps_the_old_one_serving(served) -> None:
    d, base = served
    assert load(d, "switch", doubler_carton(base / "v1"))[0] == 200
    old = index(d)["switch"]["version"]
    wrong = np.zeros_like(X)
    status, answer = load(d, "switch", doubler_carton(base / "v2", expected_y=wrong))
    assert status == 400 and "self-test failed" in answer["error"]
    row = index(d)["switch"]
    assert row["state"] == "READY" and row["version"] == old and "reload failed" in row["reason"]
    assert post(d, "/v2/models/switch/selftest", {})[1]["passed"] is True


def test_a_carton_without_self_tests_says_so(served) -> None:
    d, base = served
    assert load(d, "none", doubler_carton(base / "none", tests=0))[0] == 200
    status, report = post(d, "/v2/models/none/selftest", {})
    assert status == 200 and report["passed"] is True and report["tests"] == []
    assert report["summary"] == "no self-tests: the carton declares none"


@pytest.mark.slow
def test_selftest_on_load_off_loads_and_reports(short_tmp: Path) -> None:
    config = short_tmp / "c.toml"
    config.write_text("[runners]\nselftest_on_load = false\nselftest_atol = 0.6\n")
    wrong = X * 2
    wrong[0, 0] += 0.5
    with DaemonProcess(short_tmp / "root", listen=None, extra_args=["--config", str(config)]) as d:
        assert load(d, "m", doubler_carton(short_tmp / "m", expected_y=wrong))[0] == 200
        assert post(d, "/v2/models/m/selftest", {})[1]["passed"] is True          # atol 0.6 from the config
        status, report = post(d, "/v2/models/m/selftest", {"atol": 0.1})
        assert status == 200 and report["passed"] is False
        assert report["tests"][0]["mismatches"][0]["index"] == [0, 0]
    assert wait_for(lambda: not runner_pids(short_tmp / "root"), 10)


# -- the CLI, with no daemon ------------------------------------------------------------


def cli(root: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "CARTONSTORE_SOCKET": str(root / "none.sock")}   # no daemon there
    return subprocess.run([sys.executable, "-m", "cartonstore.cli", *args, "--root", str(root)],
                          capture_output=True, text=True, timeout=120, env=env)


@pytest.mark.slow
def test_cli_runs_self_tests_with_its_own_runner(short_tmp: Path) -> None:
    root = short_tmp / "root"
    good = cli(root, "add", str(doubler_carton(short_tmp / "good")), "--name", "good")
    assert good.returncode == 0, good.stderr
    done = cli(root, "selftest", "good")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["PASS doubles-0", "1 self-test(s) passed"]
    wrong = X * 2
    wrong[0, 1] = 100
    assert cli(root, "add", str(doubler_carton(short_tmp / "bad", expected_y=wrong)), "--name", "bad").returncode == 0
    done = cli(root, "selftest", "bad", "--json")
    assert done.returncode == 8, done.stderr
    report = json.loads(done.stdout)
    assert report["passed"] is False and report["tests"][0]["mismatches"][0]["index"] == [0, 1]
    assert cli(root, "selftest", "bad", "--atol", "200").returncode == 0
    assert not runner_pids(root)


FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "carton-repo-test.carton"


def test_a_broken_test_is_invalid_and_does_not_stop_the_load(short_tmp: Path) -> None:
    """Carton's own test carton declares a self-test whose tensors do not
    fit its inputs ('b' is float64, the test gives it strings): no request
    can be sent, which says nothing of the model."""
    with DaemonProcess(short_tmp / "root", listen=None) as d:
        status, answer = load(d, "fx", FIXTURE)
        assert status == 200, answer
        status, report = post(d, "/v2/models/fx/selftest", {})
        assert status == 200 and report["passed"] is False and report["model_failed"] is False
        (test,) = report["tests"]
        assert test["outcome"] == "invalid" and test["error"] == "input 'b': datatype is BYTES but the model expects FP64"
        assert "could not be sent (the test is broken, not the model)" in report["summary"]
        d.stop()
        assert "self-test(s) could not be sent" in d.proc.stderr.read()
    assert wait_for(lambda: not runner_pids(short_tmp / "root"), 10)


def test_only_the_tensors_a_self_test_names_are_read_and_nested_ones_are_invalid(tmp_path: Path) -> None:
    """An example's tensor is not read to run self-tests (this one's file is
    damaged: reading it would fail them all), and a test naming a nested
    tensor, which v2 cannot carry, is invalid rather than an error."""
    from cartonstore.carton.selftest import self_test_cases
    from cartonstore.format.carton_toml import parse_carton_toml

    src = doubler_carton(tmp_path / "c")
    toml = tomli.loads((src / "carton.toml").read_text())
    toml["self_test"].append({"name": "nested", "inputs": {"x": "@tensor_data/pair", "s": "@tensor_data/s"}})
    toml["example"] = [{"name": "big", "inputs": {"x": "@tensor_data/example_x"}, "sample_out": {}}]
    (src / "carton.toml").write_text(tomli_w.dumps(toml))
    index = tomli.loads((src / "tensor_data" / "index.toml").read_text())
    index["tensor"] += [{"name": "example_x", "dtype": "float32", "shape": [1000], "file": "example_x.bin"},
                        {"name": "pair", "dtype": "nested", "inner": ["x"]}]
    (src / "tensor_data" / "index.toml").write_text(tomli_w.dumps(index))
    (src / "tensor_data" / "example_x.bin").write_bytes(b"\0" * 7)   # not 4000 bytes
    cases = self_test_cases(parse_carton_toml((src / "carton.toml").read_bytes()), src)
    assert [(c.name, c.invalid is None) for c in cases] == [("doubles-0", True), ("nested", False)]
    assert "'@tensor_data/pair' is a nested tensor" in cases[1].invalid
    assert np.array_equal(cases[0].inputs["x"], X)
