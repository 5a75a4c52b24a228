"""tests/fixtures/quickstart.carton, the model the README's quick start
infers, is what tests/fixtures/make_quickstart.py writes, byte for byte,
and its self-test passes through a real runner (the fixture from Carton's
own suite, carton-repo-test.carton, has a self-test that cannot run:
`selftest` exits 8 on it)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from cartonstore.cli.commands import main

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def test_the_committed_carton_is_what_the_script_writes(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("make_quickstart", FIXTURES / "make_quickstart.py")
    assert spec and spec.loader
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    script.make(tmp_path / "quickstart.carton")
    assert (tmp_path / "quickstart.carton").read_bytes() == (FIXTURES / "quickstart.carton").read_bytes()


def test_its_self_test_passes(short_tmp: Path, capsys) -> None:
    root = short_tmp / "root"
    assert main(["selftest", str(FIXTURES / "quickstart.carton"), "--root", str(root), "--json"]) == 0, \
        capsys.readouterr().err
    report = json.loads(capsys.readouterr().out)
    assert report["passed"] and [t["outcome"] for t in report["tests"]] == ["passed"]
