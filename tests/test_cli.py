"""The CLI contract: output shape, --json keys, exit statuses, help text."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cartonstore.cli import build_parser, main
from conftest import FIXTURE_CARTON, FIXTURE_DIGEST


def run(capsys, *argv: str) -> tuple[int, str, str]:  # noqa: ANN001
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_every_command_is_documented_with_an_example() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    assert set(sub.choices) >= {"add", "path", "ls", "inspect", "export", "pack", "rm", "verify"}
    for name, sp in sub.choices.items():
        assert sp.description, name
        assert "example" in (sp.epilog or ""), name
        assert f"cartonstore {name}" in sp.epilog, name


def test_add_and_path_print_the_thing_last(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    root = str(tmp_path / "root")
    code, out, _ = run(capsys, "add", str(FIXTURE_CARTON), "--root", root)
    assert code == 0 and out.splitlines()[-1] == FIXTURE_DIGEST
    code, out, _ = run(capsys, "path", FIXTURE_DIGEST[:10], "--root", root)
    assert code == 0 and out.splitlines()[-1] == str(Path(root) / "models" / FIXTURE_DIGEST)


def test_json_output_names(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    root = str(tmp_path / "root")
    code, out, _ = run(capsys, "add", str(FIXTURE_CARTON), "--root", root, "--json", "--name", "demo")
    assert json.loads(out)["manifest_sha256"] == FIXTURE_DIGEST
    code, out, _ = run(capsys, "path", "demo", "--root", root, "--json")
    assert json.loads(out) == {"manifest_sha256": FIXTURE_DIGEST, "path": str(Path(root) / "models" / FIXTURE_DIGEST)}
    code, out, _ = run(capsys, "ls", "--root", root, "--json")
    rows = json.loads(out)
    assert [r["manifest_sha256"] for r in rows] == [FIXTURE_DIGEST] and rows[0]["names"] == ["demo"]
    code, out, _ = run(capsys, "inspect", "demo", "--root", root, "--json")
    info = json.loads(out)
    assert info["runner"]["runner_name"] == "python"
    assert {t["name"] for t in info["tensor_data"]} and len(info["files"]) == 11
    code, out, _ = run(capsys, "verify", "--root", root, "--json")
    assert code == 0 and json.loads(out)["ok"] is True
    code, out, _ = run(capsys, "export", "demo", "-o", str(tmp_path / "x.carton"), "--root", root, "--json")
    assert json.loads(out)["manifest_sha256"] == FIXTURE_DIGEST
    code, out, _ = run(capsys, "rm", "demo", "--root", root, "--json")
    assert code == 0 and json.loads(out)["manifest_sha256"] == FIXTURE_DIGEST
    code, out, _ = run(capsys, "ls", "--root", root, "--json")
    assert json.loads(out) == []


def test_inspect_text_lists_tensors_and_ends_with_the_hash(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    code, out, _ = run(capsys, "inspect", str(FIXTURE_CARTON), "--root", str(tmp_path / "r"))
    assert code == 0
    assert "runner:    python" in out
    assert "tensor_data" in out
    assert out.splitlines()[-1] == FIXTURE_DIGEST


@pytest.mark.parametrize("argv,code,pattern", [
    (["path", "missing-model"], 3, "no carton matches 'missing-model'"),
    (["add", "/nonexistent/model.carton"], 3, "no such file"),
    (["rm", "0123456789abcdef"], 3, "no carton matches"),
    (["export", "nothing", "-o", "/tmp/never.carton"], 3, "no carton matches"),
    (["add", "--name", " padded", str(FIXTURE_CARTON)], 4, "invalid name"),
])
def test_errors_go_to_stderr_with_a_category_exit(tmp_path: Path, capsys, argv, code, pattern) -> None:  # noqa: ANN001
    got, out, err = run(capsys, *argv, "--root", str(tmp_path / "root"))
    assert got == code
    assert out == ""
    assert pattern in err and err.startswith(f"cartonstore {argv[0]}: error:")


def test_verify_fails_with_exit_5_on_corruption(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    root = tmp_path / "root"
    run(capsys, "add", str(FIXTURE_CARTON), "--root", str(root))
    blob = next(p for p in (root / "blobs").rglob("*") if p.is_file())
    os.chmod(blob, 0o644)
    blob.write_bytes(b"rot")
    code, out, _ = run(capsys, "verify", "--root", str(root))
    assert code == 5 and "corrupt blob" in out and out.splitlines()[-1] == "FAILED"
    code, out, _ = run(capsys, "verify", "--repair", "--root", str(root))
    assert code == 0 and "quarantined" in out


def test_root_from_environment_and_console_script(tmp_path: Path) -> None:
    env = {**os.environ, "CARTONSTORE_ROOT": str(tmp_path / "envroot")}
    exe = Path(sys.executable).with_name("cartonstore")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "cartonstore.cli"]
    p = subprocess.run(cmd + ["add", str(FIXTURE_CARTON)], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines()[-1] == FIXTURE_DIGEST
    assert (tmp_path / "envroot" / "index.db").exists()
    p = subprocess.run(cmd + ["path", "nope"], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 3 and "no carton matches" in p.stderr


def test_settings_file_environment_and_flags(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    cfg = tmp_path / "cs.toml"
    cfg.write_text('[server]\nlisten = "127.0.0.1:7000"\n[fetch]\nretries = 2\n')
    code, out, err = run(capsys, "serve", "--config", str(cfg), "--root", str(tmp_path / "r"), "--print-config")
    assert code == 0 and 'listen = "127.0.0.1:7000"' in out and "retries = 2" in out
    code, out, _ = run(capsys, "serve", "--config", str(cfg), "--listen", "127.0.0.1:7001", "--print-config")
    assert 'listen = "127.0.0.1:7001"' in out
    cfg.write_text('[fetch]\nretries = "many"\n')
    code, out, err = run(capsys, "ls", "--config", str(cfg), "--root", str(tmp_path / "r"))
    assert code == 4 and "fetch.retries" in err and str(cfg) in err
    cfg.write_text('[server]\nlisen = "x"\n')
    code, out, err = run(capsys, "serve", "--config", str(cfg))
    assert code == 4 and "did you mean 'server.listen'" in err
    code, out, err = run(capsys, "serve", "--listen", "10.1.2.3:80", "--root", str(tmp_path / "r"))
    assert code == 4 and "server.listen" in err
