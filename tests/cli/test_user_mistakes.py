"""The mistakes a newcomer makes get one line and their own exit status,
with a hint where one exists, and change nothing in the store (issue 38,
item 5): an unreadable file to add, a model file given to add, a model
file or carton that is not there, a carton file to inspect (read where
it is, never added), a port already taken at serve (HTTP and gRPC alike).
Each runs the real CLI: in-process through main, or as a process where a
user or a daemon is part of the mistake."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import FIXTURE_CARTON, FIXTURE_DIGEST, snapshot
from kit.clikit import run
from kit.runnerkit import onnx_model_dir

from cartonstore.store import Store

NOBODY = 65534


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: a file only root may read, added by uid 65534")
def test_adding_a_file_this_user_may_not_read_names_its_owner_and_mode(short_tmp: Path) -> None:
    tmp_path = short_tmp   # under a directory uid 65534 may pass through
    os.chmod(tmp_path, 0o755)
    secret = tmp_path / "secret.carton"
    shutil.copy(FIXTURE_CARTON, secret)
    os.chmod(secret, 0o600)
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, NOBODY, NOBODY)
    with Store(theirs / "root"):
        pass
    for dirpath, dirnames, filenames in os.walk(theirs):
        for name in [".", *dirnames, *filenames]:
            os.chown(os.path.join(dirpath, name), NOBODY, NOBODY)
    before = snapshot(theirs / "root")
    done = subprocess.run([sys.executable, "-m", "cartonstore.cli", "add", str(secret), "--root", str(theirs / "root"),
                           "--progress", "none"], user=NOBODY, group=NOBODY, extra_groups=[], capture_output=True,
                          text=True, timeout=60, cwd="/")
    assert done.returncode == 9, done.stderr
    assert done.stderr == f"cartonstore add: error: permission denied: {secret} is owned by root:root, mode 0600: " \
                          "run as root\n"
    assert snapshot(theirs / "root") == before


@pytest.mark.parametrize("suffix", [".onnx", ".pt"])
def test_adding_a_model_file_says_to_pack_it_first(root: Path, tmp_path: Path, capsys, suffix: str) -> None:
    if suffix == ".onnx":
        model = onnx_model_dir(tmp_path / "src", ids=False) / "model" / "model.onnx"
    else:   # a TorchScript file is a zip, though not a carton's
        model = tmp_path / "model.pt"
        with zipfile.ZipFile(model, "w") as z:
            z.writestr("model/data.pkl", b"\x80\x02}q\x00.")
    before = snapshot(root)
    code, out, err = run(capsys, "add", str(model), "--root", str(root), "--progress", "none")
    assert code == 4 and out == "" and err.count("\n") == 1, err
    assert err.startswith(f"cartonstore add: error: {model} is a model file, not a carton (")
    assert err.endswith(f"make a carton of it with `cartonstore pack {model} -o model.carton`, then add that\n")
    assert snapshot(root) == before


@pytest.mark.parametrize("argv,line", [
    (["pack", "nope.onnx", "-o", "out.carton"], "cartonstore pack: error: no such file: nope.onnx"),
    (["pack", "nope", "-o", "out.carton"], "cartonstore pack: error: no such file or directory: nope"),
    (["inspect", "./nope.carton"], "cartonstore inspect: error: no such file or directory: ./nope.carton"),
    (["inspect", "nope.carton"],   # a name may end in .carton
     "cartonstore inspect: error: no such file or directory: nope.carton, and no carton is named 'nope.carton'"),
    (["path", "./nope.carton"], "cartonstore path: error: no such file or directory: ./nope.carton"),
    (["inspect", "nope"], "cartonstore inspect: error: no carton matches 'nope' (not a known manifest hash, "
                          "hash prefix or name)"),
    (["inspect", "https://example.invalid/m.carton"],   # nothing is fetched: no connection is tried
     "cartonstore inspect: error: https://example.invalid/m.carton is a URL, not a carton in the store: add it "
     "first (cartonstore add https://example.invalid/m.carton), then name it by its name or hash"),
])
def test_what_is_not_there_is_named_as_what_it_looks_like(root: Path, tmp_path: Path, monkeypatch, capsys,
                                                          argv: list[str], line: str) -> None:
    monkeypatch.chdir(tmp_path)
    before = snapshot(root)
    code, out, err = run(capsys, *argv, *([] if argv[0] == "pack" else ["--root", str(root)]))
    assert (code, out, err) == (3, "", line + "\n")
    assert snapshot(root) == before and not (tmp_path / "out.carton").exists()


def test_inspecting_a_carton_file_reads_it_where_it_is(tmp_path: Path, capsys) -> None:
    import json

    root = tmp_path / "root"
    with Store(root):
        pass
    before = snapshot(root)
    code, out, err = run(capsys, "inspect", str(FIXTURE_CARTON), "--root", str(root), "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert (doc["manifest_sha256"], doc["in_store"], doc["names"], doc["complete"]) == (FIXTURE_DIGEST, False, [], True)
    assert doc["source"] == str(FIXTURE_CARTON) and len(doc["files"]) == 11 and doc["tensor_data"]
    assert snapshot(root) == before   # nothing added: no carton, no blob, no name
    code, out, _ = run(capsys, "inspect", str(FIXTURE_CARTON), "--root", str(root))
    assert code == 0 and out.splitlines()[-1] == FIXTURE_DIGEST and "runner:    python" in out
    assert snapshot(root) == before
    with Store(root) as s:   # once the store holds it, the file's report says what the store calls it
        s.add(FIXTURE_CARTON, name="tiny")
    code, out, _ = run(capsys, "inspect", str(FIXTURE_CARTON), "--root", str(root), "--json")
    assert code == 0 and json.loads(out)["in_store"] is True and json.loads(out)["names"] == ["tiny"]


@pytest.mark.parametrize("flag", ["--listen", "--grpc-listen"])
def test_a_port_in_use_at_serve_is_one_line_and_exit_6(tmp_path: Path, flag: str) -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    try:
        done = subprocess.run([sys.executable, "-m", "cartonstore.cli", "serve", "--root", str(tmp_path / "root"),
                               "--socket", str(tmp_path / "d.sock"), flag, f"127.0.0.1:{port}"],
                              capture_output=True, text=True, timeout=60)
    finally:
        taken.close()
    setting = "server.grpc_listen: " if flag == "--grpc-listen" else ""
    assert done.returncode == 6, done.stderr
    # the daemon's own log lines (its sandbox, its limits) may come first: the error is one line, the last
    assert done.stderr.splitlines()[-1] == (f"cartonstore serve: error: {setting}cannot listen on 127.0.0.1:{port}: "
                                            "Address already in use")
    assert "Traceback" not in done.stderr and done.stderr.count("error") == 1
