"""The CLI contract: output shape, --json keys, exit statuses, help text."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import FIXTURE_CARTON, FIXTURE_DIGEST
from kit.clikit import run

from cartonstore.cli.args import _commands
from cartonstore.cli.commands import build_parser


def test_every_command_is_documented_with_an_example() -> None:
    choices = _commands(build_parser())
    assert set(choices) >= {"add", "path", "ls", "inspect", "export", "pack", "rm", "verify"}
    for name, sp in choices.items():
        assert sp.description, name
        assert "example" in (sp.epilog or ""), name
        assert f"cartonstore {name}" in sp.epilog, name


def test_add_and_path_print_the_thing_last(tmp_path: Path, capsys) -> None:
    root = str(tmp_path / "root")
    code, out, _ = run(capsys, "add", str(FIXTURE_CARTON), "--root", root)
    assert code == 0 and out.splitlines()[-1] == FIXTURE_DIGEST
    code, out, _ = run(capsys, "path", FIXTURE_DIGEST[:10], "--root", root)
    assert code == 0 and out.splitlines()[-1] == str(Path(root) / "models" / FIXTURE_DIGEST)


def test_json_output_names(tmp_path: Path, capsys) -> None:
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


def test_inspect_text_lists_tensors_and_ends_with_the_hash(tmp_path: Path, capsys) -> None:
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
def test_errors_go_to_stderr_with_a_category_exit(tmp_path: Path, capsys, argv, code, pattern) -> None:
    got, out, err = run(capsys, *argv, "--root", str(tmp_path / "root"))
    assert got == code
    assert out == ""
    assert pattern in err and err.startswith(f"cartonstore {argv[0]}: error:")


def test_verify_fails_with_exit_5_on_corruption(tmp_path: Path, capsys) -> None:
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
    p = subprocess.run([*cmd, "add", str(FIXTURE_CARTON)], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines()[-1] == FIXTURE_DIGEST
    assert (tmp_path / "envroot" / "index.db").exists()
    p = subprocess.run([*cmd, "path", "nope"], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 3 and "no carton matches" in p.stderr


def test_settings_file_environment_and_flags(tmp_path: Path, capsys) -> None:
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


def test_printed_settings_say_a_token_is_set_never_what_it_is(tmp_path: Path, capsys,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from cartonstore.config import load_config

    cfg = tmp_path / "cs.toml"
    cfg.write_text('[peers]\ntoken = "peer-secret-1"\n')
    monkeypatch.setenv("HF_TOKEN", "hf_secret_2")
    code, out, _ = run(capsys, "serve", "--config", str(cfg), "--root", str(tmp_path / "r"), "--print-config")
    assert code == 0 and out.count('token = "(set; not shown)"') == 2
    assert "secret" not in out
    fetch = load_config(cfg).fetch_config()
    assert fetch.hub.token == "hf_secret_2" and "secret" not in repr(fetch)
    cfg.write_text('[server]\ntoken = "server-secret-3"\n')
    code, out, _ = run(capsys, "serve", "--config", str(cfg), "--root", str(tmp_path / "r"), "--print-config")
    assert code == 0 and "server-secret-3" not in out and out.count('token = "(set; not shown)"') == 2   # server, hf


def test_ls_and_inspect_show_the_size_of_files_that_came_through_links(tmp_path: Path, capsys, origin) -> None:
    """A LINKS file has no size until it is fetched: the carton is listed as
    '?' (null) while lazy, then with its whole size once complete."""
    from conftest import MINIMAL_TOML
    from kit.fetchkit import linked_carton

    payload = os.urandom(300_000)
    carton, _ = linked_carton(tmp_path, origin, {"model/w.bin": payload}, extra={"model/small": b"inline"})
    root = str(tmp_path / "root")
    code, out, err = run(capsys, "add", str(carton), "--lazy", "--root", root, "--progress", "none")
    assert code == 0, err
    digest = out.splitlines()[-1]
    code, out, _ = run(capsys, "ls", "--root", root, "--json")
    assert json.loads(out)[0]["size"] is None
    code, out, _ = run(capsys, "ls", "--root", root)
    assert out.split()[1:3] == ["partial", "?"]
    code, out, _ = run(capsys, "inspect", digest, "--root", root)
    assert "size:      ? (" in out and "1 linked file(s) not fetched yet" in out
    code, _, err = run(capsys, "path", digest, "--root", root, "--progress", "none")
    assert code == 0, err
    total = len(payload) + len(b"inline") + len(MINIMAL_TOML)
    code, out, _ = run(capsys, "ls", "--root", root, "--json")
    assert json.loads(out)[0]["size"] == total and json.loads(out)[0]["complete"] is True
    code, out, _ = run(capsys, "ls", "--root", root)
    assert out.split()[1:4] == ["complete", f"{total / 1024:.1f}", "KiB"]
    code, out, _ = run(capsys, "inspect", digest, "--root", root, "--json")
    info = json.loads(out)
    assert info["size"] == total
    assert {f["path"]: f["size"] for f in info["files"]}["model/w.bin"] == len(payload)
    code, out, _ = run(capsys, "inspect", digest, "--root", root)
    assert f"size:      {total / 1024:.1f} KiB" in out and " ? " not in out
    assert f"{len(payload):>12}  model/w.bin" in out
    # Known once fetched: evicted, then added lazily again, the sizes stay.
    assert run(capsys, "gc", "--root", root, "--local", "--max-size", "0")[0] == 0
    assert run(capsys, "add", str(carton), "--lazy", "--root", root, "--progress", "none")[0] == 0
    _, out, _ = run(capsys, "inspect", digest, "--root", root, "--json")
    info = json.loads(out)
    assert info["complete"] is False and info["size"] == total
    assert {f["path"]: f["size"] for f in info["files"]}["model/w.bin"] == len(payload)


def test_a_carton_added_complete_through_links_has_its_size_at_once(tmp_path: Path, capsys, origin) -> None:
    from conftest import MINIMAL_TOML
    from kit.fetchkit import linked_carton

    carton, _ = linked_carton(tmp_path, origin, {"model/a.bin": b"a" * 70_000, "model/b.bin": b"b" * 50_000})
    root = str(tmp_path / "root")
    assert run(capsys, "add", str(carton), "--root", root, "--progress", "none")[0] == 0
    _, out, _ = run(capsys, "ls", "--root", root, "--json")
    assert json.loads(out)[0]["size"] == 120_000 + len(MINIMAL_TOML)


def test_sizes_already_fetched_are_learned_by_an_older_store(tmp_path: Path, capsys, origin) -> None:
    """A store written before sizes were learned (entries and total NULL
    although the blobs are there) learns them once, when it is opened."""
    import sqlite3

    from conftest import MINIMAL_TOML
    from kit.fetchkit import linked_carton

    from cartonstore.store import Store

    carton, _ = linked_carton(tmp_path, origin, {"model/w.bin": b"w" * 40_000})
    root = tmp_path / "root"
    assert run(capsys, "add", str(carton), "--root", str(root), "--progress", "none")[0] == 0
    conn = sqlite3.connect(root / "index.db")
    with conn:
        conn.execute("UPDATE entries SET size=NULL WHERE path='model/w.bin'")
        conn.execute("UPDATE cartons SET total_size=NULL")
        conn.execute("DELETE FROM meta WHERE key='sizes_learned'")
    conn.close()
    _, out, _ = run(capsys, "ls", "--root", str(root), "--json")
    assert json.loads(out)[0]["size"] == 40_000 + len(MINIMAL_TOML)
    with Store(root) as s:
        sizes = {e.path: e.size for e in s.index.entries(s.resolve("tiny"))}
    assert sizes["model/w.bin"] == 40_000
