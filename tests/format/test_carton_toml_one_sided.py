"""carton.toml with inputs but no outputs (or outputs but no inputs) is
accepted, as Carton's own loader accepts it (issue 11 §2); the daemon's
model metadata lists what is given."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from conftest import MINIMAL_TOML, carton_entries, write_zip
from kit.daemonkit import DaemonProcess, unix_session

from cartonstore.cli.commands import main
from cartonstore.errors import InvalidCarton
from cartonstore.format.carton_toml import TensorSpec, parse_carton_toml
from cartonstore.store import Store

INPUT = b'\n[[input]]\nname = "x"\ndtype = "float32"\nshape = ["batch", 4]\n'
OUTPUT = b'\n[[output]]\nname = "y"\ndtype = "int64"\nshape = "*"\n'


def test_inputs_without_outputs_are_accepted() -> None:
    config = parse_carton_toml(MINIMAL_TOML + INPUT)
    assert config.inputs == (TensorSpec("x", "float32", ("batch", 4)),)
    assert config.outputs is None


def test_outputs_without_inputs_are_accepted() -> None:
    config = parse_carton_toml(MINIMAL_TOML + OUTPUT)
    assert config.inputs is None
    assert config.outputs == (TensorSpec("y", "int64", "*"),)


def test_a_self_test_still_needs_the_tensors_it_names() -> None:
    with pytest.raises(InvalidCarton, match=r"needs \[\[input\]\] to be declared") as info:
        parse_carton_toml(MINIMAL_TOML + OUTPUT + b'\n[[self_test]]\ninputs = {}\n')
    assert info.value.field == "self_test"
    with pytest.raises(InvalidCarton, match=r"'y' is not a declared output \(none\)"):
        parse_carton_toml(MINIMAL_TOML + INPUT + b'\n[[self_test]]\ninputs = { x = "@tensor_data/t" }\n'
                          b'expected_out = { y = "@tensor_data/t" }\n')


def test_a_one_sided_carton_is_added(store: Store, tmp_path: Path) -> None:
    path = write_zip(tmp_path / "in.carton", carton_entries({"carton.toml": MINIMAL_TOML + INPUT,
                                                             "model/w.bin": b"w"}))
    r = store.add(path)
    assert r.complete and store.config_of(r.digest).outputs is None


async def _get(sock: Path, path: str) -> tuple[int, dict]:
    async with unix_session(sock) as s, s.get(path) as r:
        return r.status, json.loads(await r.text())


@pytest.mark.parametrize(("extra", "inputs", "outputs"), [
    (INPUT, [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}], []),
    (OUTPUT, [], [{"name": "y", "datatype": "INT64", "shape": [-1]}]),
], ids=["inputs-only", "outputs-only"])
def test_model_metadata_lists_what_is_given(daemon: DaemonProcess, tmp_path: Path, capsys, extra: bytes,
                                            inputs: list, outputs: list) -> None:
    carton = write_zip(tmp_path / "one.carton", carton_entries({"carton.toml": MINIMAL_TOML + extra,
                                                                "model/w.bin": b"w"}))
    assert main(["add", str(carton), "--name", "one", "--root", str(daemon.root), "--progress", "none"]) == 0
    capsys.readouterr()
    status, md = asyncio.run(_get(daemon.socket_path, "/v2/models/one"))
    assert status == 200, md
    assert md["inputs"] == inputs and md["outputs"] == outputs
