"""Names never move to another model without the user asking (issue 15, 1).

A default name (the carton's model_name) only takes a free name; an explicit
one (--name, a Triton load by name) may move a name and says so; a name the
daemon has loaded moves only with --force; names follow Triton's rules.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as triton
from conftest import FIXTURE_CARTON, FIXTURE_DIGEST, snapshot
from kit.daemonkit import DaemonProcess
from tritonclient.utils import InferenceServerException

from cartonstore.cli.commands import main
from cartonstore.errors import Conflict, InvalidInput
from cartonstore.store import Store, validate_name
from cartonstore.store.metadata.names import default_name, pin_lease_id

TINY_TOML = b'spec_version = 1\nmodel_name = "tiny"\n[runner]\nrunner_name = "none"\nrequired_framework_version = "*"\n'


def unpacked(tmp_path: Path, label: str, model_name: str = "tiny") -> Path:
    d = tmp_path / label
    (d / "model").mkdir(parents=True, exist_ok=True)
    (d / "carton.toml").write_bytes(TINY_TOML.replace(b'"tiny"', f'"{model_name}"'.encode()))
    (d / "model" / "w.bin").write_bytes(label.encode() * 10)
    return d


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main([*argv, "--progress", "none"] if argv[0] in ("add", "path") else list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def names(root: Path) -> dict[str, str]:
    with Store(root) as s:
        return {n: c.row.digest for c in s.list() for n in c.names}


def test_a_default_name_never_takes_an_explicit_one(tmp_path: Path, capsys) -> None:
    root = str(tmp_path / "root")
    assert cli(capsys, "add", str(FIXTURE_CARTON), "--name", "tiny", "--root", root)[0] == 0
    code, out, err = cli(capsys, "path", str(unpacked(tmp_path, "d")), "--root", root)
    assert code == 0
    assert names(Path(root))["tiny"] == FIXTURE_DIGEST
    new = Path(out.splitlines()[-1]).name
    assert f"name tiny is kept by {FIXTURE_DIGEST[:8]}; this carton is reachable by its hash {new[:8]}" in err
    # The same on add, with --json saying who kept it.
    code, out, err = cli(capsys, "add", str(unpacked(tmp_path, "e")), "--root", root, "--json")
    data = json.loads(out)
    assert data["name"] is None and data["naming"]["kept_by"] == FIXTURE_DIGEST
    assert "is kept by" in err and names(Path(root))["tiny"] == FIXTURE_DIGEST


def test_a_default_name_is_applied_when_free_and_kept_by_the_first(tmp_path: Path, capsys) -> None:
    root = str(tmp_path / "root")
    _code, out, err = cli(capsys, "add", str(unpacked(tmp_path, "a")), "--root", root, "--json")
    first = json.loads(out)
    assert first["name"] == "tiny" and err == ""
    _code, out, _ = cli(capsys, "add", str(unpacked(tmp_path, "b")), "--root", root, "--json")
    assert json.loads(out)["name"] is None
    assert names(Path(root)) == {"tiny": first["manifest_sha256"]}
    # Re-adding the carton that holds the name changes nothing and says nothing.
    _code, out, err = cli(capsys, "add", str(unpacked(tmp_path, "a")), "--root", root, "--json")
    assert json.loads(out)["name"] == "tiny" and "kept" not in err


def test_a_model_name_that_cannot_be_a_name_stays_unnamed(tmp_path: Path, capsys) -> None:
    root = str(tmp_path / "root")
    code, out, _ = cli(capsys, "add", str(unpacked(tmp_path, "a", model_name="/ /")), "--root", root, "--json")
    assert code == 0 and json.loads(out)["name"] is None and names(Path(root)) == {}
    code, out, _ = cli(capsys, "add", str(unpacked(tmp_path, "b", model_name="has space/slash")), "--root", root,
                       "--json")
    assert code == 0 and json.loads(out)["name"] == "has-space-slash"


def test_an_explicit_name_moves_and_says_what_it_moved(tmp_path: Path, capsys) -> None:
    root = str(tmp_path / "root")
    cli(capsys, "add", str(FIXTURE_CARTON), "--name", "tiny", "--root", root)
    code, out, err = cli(capsys, "add", str(unpacked(tmp_path, "d")), "--name", "tiny", "--root", root)
    new = out.splitlines()[-1]
    assert code == 0 and names(Path(root))["tiny"] == new
    assert f"name tiny: {FIXTURE_DIGEST[:8]} \u2192 {new[:8]}" in err
    code, out, err = cli(capsys, "add", str(FIXTURE_CARTON), "--name", "tiny", "--root", root, "--json")
    data = json.loads(out)
    assert data["naming"] == {"name": "tiny", "moved_from": new, "kept_by": None}
    assert names(Path(root))["tiny"] == FIXTURE_DIGEST


@pytest.mark.parametrize("bad", ["bad name/with slash", ".hidden", "", "a" * 256, "tab\there", "caf\u00e9",
                                 "deadbeef00", "x?y", "%2e%2e"])
def test_names_follow_tritons_rules(tmp_path: Path, capsys, bad: str) -> None:
    root = tmp_path / "root"
    cli(capsys, "add", str(FIXTURE_CARTON), "--name", "keep", "--root", str(root))
    before = snapshot(root)
    code, _, err = cli(capsys, "add", str(unpacked(tmp_path, "d")), "--name", bad, "--root", str(root))
    assert code == 4 and "invalid name" in err
    assert snapshot(root) == before


@pytest.mark.parametrize("good", ["a", "resnet-50_v1.2", "A" * 255, "0", "model.onnx", "_x"])
def test_valid_names(good: str) -> None:
    assert validate_name(good) == good


def test_names_of_255_bytes_not_characters() -> None:
    with pytest.raises(InvalidInput, match="at most 255 bytes"):
        validate_name("a" * 256)


def pin(root: Path, name: str, digest: str, ttl: float = 60) -> None:
    """A daemon's pin, as one whose owner token is a1b2c3d4e5f6 takes it."""
    with Store(root) as s:
        s.index.create_lease(digest, ttl, f"loaded:{name}", pin_lease_id("a1b2c3d4e5f6", name))


def test_moving_a_loaded_name_is_a_conflict_unless_forced(tmp_path: Path, capsys) -> None:
    root = tmp_path / "root"
    cli(capsys, "add", str(FIXTURE_CARTON), "--name", "tiny", "--root", str(root))
    pin(root, "tiny", FIXTURE_DIGEST)
    with Store(root) as s:
        lease = s.index.create_lease(FIXTURE_DIGEST, 60, "loader", None)
    before = snapshot(root)
    code, _, err = cli(capsys, "add", str(unpacked(tmp_path, "d")), "--name", "tiny", "--root", str(root))
    assert code == 7
    assert f"name tiny is loaded by the daemon as version {FIXTURE_DIGEST[:8]}" in err and "--force" in err
    assert snapshot(root) == before
    # Re-adding the loaded carton under its own name is no move.
    assert cli(capsys, "add", str(FIXTURE_CARTON), "--name", "tiny", "--root", str(root))[0] == 0
    code, out, err = cli(capsys, "add", str(unpacked(tmp_path, "d")), "--name", "tiny", "--root", str(root),
                         "--force")
    assert code == 0 and names(root)["tiny"] == out.splitlines()[-1] and "name tiny:" in err
    with Store(root) as s:  # leases on the old carton stay valid
        assert s.index.lease(lease.id).carton == FIXTURE_DIGEST


def test_an_expired_pin_does_not_hold_the_name(tmp_path: Path, capsys) -> None:
    root = tmp_path / "root"
    cli(capsys, "add", str(FIXTURE_CARTON), "--name", "tiny", "--root", str(root))
    pin(root, "tiny", FIXTURE_DIGEST, ttl=0.01)
    time.sleep(0.05)
    assert cli(capsys, "add", str(unpacked(tmp_path, "d")), "--name", "tiny", "--root", str(root))[0] == 0


def test_library_conflict_leaves_the_store_as_it_was(tmp_path: Path) -> None:
    root = tmp_path / "root"
    with Store(root) as s:
        s.add(FIXTURE_CARTON, name="tiny")
    pin(root, "tiny", FIXTURE_DIGEST)
    before = snapshot(root)
    with Store(root) as s, pytest.raises(Conflict):
        s.add(unpacked(tmp_path, "d"), name="tiny")
    assert snapshot(root) == before


def test_daemon_uploads_do_not_take_names_by_default(daemon: DaemonProcess, tmp_path: Path, capsys) -> None:
    assert cli(capsys, "add", str(FIXTURE_CARTON), "--name", "tiny", "--root", str(daemon.root))[0] == 0
    d = unpacked(tmp_path, "up")
    files = {f"file:1/{p.relative_to(d)}": p.read_bytes() for p in d.rglob("*") if p.is_file()}
    c = triton.InferenceServerClient(daemon.host_port)
    try:
        c.load_model("other", files=files)
        assert names(daemon.root)["tiny"] == FIXTURE_DIGEST  # the upload's model_name took nothing
        assert names(daemon.root)["other"] != FIXTURE_DIGEST
        with pytest.raises(InferenceServerException, match="invalid name"):
            c.load_model("bad name", files=files)
        # A load by name switches the daemon's own loaded name (a version switch).
        c.load_model("tiny", files=files)
        assert names(daemon.root)["tiny"] == names(daemon.root)["other"]
    finally:
        c.close()


def test_every_door_holds_names_and_versions_to_one_grammar(daemon: DaemonProcess, tmp_path: Path,
                                                            capsys) -> None:
    """A name starting with '-' (which a runner's command line would read
    as an option) or '.' is a 400 naming the rule at every door, before any
    lookup: each HTTP route that names a model, the daemon's own infer
    route, each gRPC call, and the CLI."""
    import tritonclient.grpc as triton_grpc
    from kit.daemonkit import call

    rule = "does not start with '.' or '-'"
    for method, path in (("GET", "/v2/models/-x"), ("GET", "/v2/models/-x/ready"), ("GET", "/v2/models/-x/stats"),
                         ("GET", "/v2/models/-x/config"), ("POST", "/v2/models/-x/infer"),
                         ("POST", "/v2/repository/models/-x/load"), ("POST", "/v2/repository/models/-x/unload"),
                         ("GET", "/v2/models/m/versions/.v/ready"), ("POST", "/v2/models/m/versions/-v/infer"),
                         ("GET", "/v2/models/-x/examples")):
        status, body = call(daemon, method, path, json={})
        assert status == 400 and rule in body["error"], (method, path, status, body)
    assert call(daemon, "GET", "/v2/models/ok-name/ready")[0] == 400   # a good name is looked up: not loaded
    assert "invalid" not in str(call(daemon, "GET", "/v2/models/ok-name/ready")[1])
    g = triton_grpc.InferenceServerClient(daemon.grpc_unix)
    try:
        for ask in (lambda: g.get_model_metadata("-x"), lambda: g.is_model_ready("-x"),
                    lambda: g.get_model_config("-x"), lambda: g.load_model("-x"), lambda: g.unload_model("-x"),
                    lambda: g.get_inference_statistics("-x"), lambda: g.get_model_metadata("m", ".v"),
                    lambda: g.infer("-x", [triton_grpc.InferInput("a", [1], "FP32").set_data_from_numpy(
                        np.zeros(1, np.float32))])):
            with pytest.raises(InferenceServerException, match=rule):
                ask()
    finally:
        g.close()
    code, _, err = cli(capsys, "add", str(unpacked(tmp_path, "d")), "--name=-x", "--root", str(daemon.root))
    assert code == 4 and rule in err


@pytest.mark.parametrize(("model_name", "name"), [
    ("resnet", "resnet"),
    ("acme/tiny", "acme-tiny"),                       # a Hugging Face repository
    ("llama3.2:1b", "llama3.2-1b"),                   # an Ollama model
    ("registry.example/ns/m:v1", "registry.example-ns-m-v1"),
    ("a  b//c", "a-b-c"),                             # a run of refused characters is one dash
    ("///", None),
    ("deadbeefcafe", None),                           # would read as a hash prefix
    (None, None),
])
def test_a_model_name_other_tools_write_is_a_default_name_with_dashes(model_name: str | None,
                                                                       name: str | None) -> None:
    assert default_name(model_name) == name
