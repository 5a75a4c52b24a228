"""Exit statuses and messages are the documented ones (issue 15, section 3):
each case runs the real CLI on a real store, a real HTTP origin or a real
daemon, and checks the exit status, the words of the error and that the
store did not change."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import (
    FIXTURE_CARTON,
    FIXTURE_DIGEST,
    MINIMAL_TOML,
    carton_entries,
    manifest_for,
    snapshot,
    write_zip,
)
from kit.clikit import run
from kit.daemonkit import DaemonProcess, unix_session

from cartonstore.cli.args import _commands, arrange_argv
from cartonstore.cli.commands import build_parser, main
from cartonstore.cli.parser import COMMANDS
from cartonstore.store import Store

GOOD = {"carton.toml": MINIMAL_TOML, "model/w.bin": b"weights"}


@pytest.fixture
def fast(tmp_path: Path) -> Path:
    """Settings that make a failing fetch fail in well under a second."""
    cfg = tmp_path / "fast.toml"
    cfg.write_text('[fetch]\nretries = 1\nbackoff_base = "10ms"\nbackoff_max = "20ms"\nconnect_timeout = "2s"\n')
    return cfg


# -- integrity: a file that does not match its MANIFEST line exits 5 ----------


def tampered(tmp_path: Path, which: str) -> Path:
    files = {**GOOD, which: GOOD[which] + b"\n"}  # MANIFEST still lists the good bytes
    return write_zip(tmp_path / f"tampered-{which.replace('/', '-')}.carton",
                     carton_entries(files, manifest=manifest_for(GOOD)))


@pytest.mark.parametrize("which", ["model/w.bin", "carton.toml"])
def test_a_file_that_does_not_match_its_manifest_line_exits_5(which: str, root: Path, tmp_path: Path,
                                                               capsys) -> None:
    bad = tampered(tmp_path, which)
    before = snapshot(root)
    code, out, err = run(capsys, "add", str(bad), "--root", str(root), "--progress", "none")
    assert code == 5, err
    assert err.startswith(f"cartonstore add: error: {which}: does not match MANIFEST"), err
    assert out == "" and snapshot(root) == before


def test_a_remote_file_that_does_not_match_its_manifest_line_exits_5(root: Path, tmp_path: Path, origin,
                                                                      fast: Path, capsys) -> None:
    origin.put("/tampered.carton", tampered(tmp_path, "model/w.bin").read_bytes())
    before = snapshot(root)
    code, _, err = run(capsys, "add", origin.url("/tampered.carton"), "--root", str(root), "--config", str(fast),
                       "--progress", "none")
    assert code == 5 and "model/w.bin: does not match MANIFEST" in err, err
    assert f"MANIFEST: {origin.url('/tampered.carton')}: bytes hash to" in err, err  # names the source
    assert snapshot(root) == before


# -- fetching: 404 is not found, a refused connection says so plainly ----------


def test_a_carton_url_that_answers_404_exits_3(root: Path, origin, fast: Path, capsys) -> None:
    before = snapshot(root)
    code, out, err = run(capsys, "add", origin.url("/gone.carton"), "--root", str(root), "--config", str(fast),
                         "--progress", "none")
    assert code == 3, err
    assert f"{origin.url('/gone.carton')}: HTTP 404" in err
    assert origin.count("/gone.carton") == 1, "a 404 is not retried"
    assert out == "" and snapshot(root) == before


def test_a_refused_connection_exits_6_in_plain_words(root: Path, fast: Path, capsys) -> None:
    with socket.socket() as s:  # a port nobody listens on: bound, then closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/m.carton"
    before = snapshot(root)
    code, _, err = run(capsys, "add", url, "--root", str(root), "--config", str(fast), "--progress", "none")
    assert code == 6, err
    assert err.strip() == f"cartonstore add: error: {url}: cannot connect to 127.0.0.1:{port}: connection refused"
    assert "ssl:" not in err and "Connect call failed" not in err
    assert snapshot(root) == before


def test_tls_to_a_plain_http_server_says_the_handshake_failed(root: Path, fast: Path, origin,
                                                               capsys) -> None:
    origin.put("/m.carton", FIXTURE_CARTON.read_bytes())
    url = origin.url("/m.carton").replace("http://", "https://", 1)
    before = snapshot(root)
    code, _, err = run(capsys, "add", url, "--root", str(root), "--config", str(fast), "--progress", "plain")
    assert code == 6, err
    assert "TLS handshake failed" in err and "operation not permitted" not in err, err
    assert snapshot(root) == before


# -- rm says who holds a carton -------------------------------------------------


def test_rm_of_a_leased_carton_names_the_leases_and_their_expiry(root: Path, capsys) -> None:
    with Store(root) as s:
        lease = s.index.create_lease(FIXTURE_DIGEST, 600, holder="loader-7")
    before = snapshot(root)
    code, _, err = run(capsys, "rm", "tiny", "--root", str(root))
    assert code == 7, err
    assert f"carton {FIXTURE_DIGEST[:8]} is leased: lease {lease.id} (holder 'loader-7') expires in " in err
    assert "running loader" not in err and "DELETE /v1/leases/" in err
    assert snapshot(root) == before


async def _post(sock: Path, path: str) -> tuple[int, str]:
    async with unix_session(sock) as session, session.post(path, data=b"") as r:
        return r.status, await r.text()


def test_rm_of_a_loaded_model_says_how_to_unload_it(daemon: DaemonProcess, capsys) -> None:
    with Store(daemon.root) as s:
        s.add(FIXTURE_CARTON, name="tiny2")
    status, text = asyncio.run(_post(daemon.socket_path, "/v2/repository/models/tiny2/load"))
    assert status == 200, text
    before = snapshot(daemon.root)
    code, _, err = run(capsys, "rm", "tiny2", "--root", str(daemon.root))
    assert code == 7, err
    assert "loaded as tiny2 by the daemon: unload it first: cartonstore unload tiny2" in err, err
    assert snapshot(daemon.root)[0] == before[0], "files changed"  # the daemon renews its pin rows meanwhile
    with Store(daemon.root) as s:
        assert s.resolve("tiny2") == FIXTURE_DIGEST
    assert asyncio.run(_post(daemon.socket_path, "/v2/repository/models/tiny2/unload"))[0] == 200
    code, out, err = run(capsys, "rm", "tiny2", "--root", str(daemon.root))
    assert code == 0 and out.splitlines()[-1] == FIXTURE_DIGEST, err


# -- options before the command -------------------------------------------------


def value_options() -> list[tuple[str, str, bool]]:
    """(command, option, takes a value) for every option of every command."""
    commands = _commands(build_parser())
    return [(name, opt, action.nargs != 0) for name, sp in commands.items()
            for opt, action in sp._option_string_actions.items() if opt not in ("-h", "--help")]


@pytest.mark.parametrize("command,option,takes_value", value_options())
def test_every_option_of_a_command_may_come_before_it(command: str, option: str, takes_value: bool) -> None:
    parser = build_parser()
    given = [option, "VALUE"] if takes_value else [option]
    assert arrange_argv(parser, [*given, command, "ARG"]) == [command, *given, "ARG"]
    if takes_value:
        assert arrange_argv(parser, [f"{option}=VALUE", command]) == [command, f"{option}=VALUE"]


@pytest.mark.parametrize("argv,arranged", [
    (["--ro", "D", "ls"], ["ls", "--ro", "D"]),                    # a unique prefix, as argparse allows after
    (["--root", "D", "lss"], ["lss", "--root", "D"]),              # argparse names the unknown command
    (["--json", "-h"], ["-h", "--json"]),                          # no command: the main help
    (["--version"], ["--version"]),
    (["gc", "--max-size", "-5G", "--grace", "-1h"], ["gc", "--max-size=-5G", "--grace=-1h"]),
    (["add", "x", "--name", "n", "--", "-5"], ["add", "x", "--name", "n", "--", "-5"]),
])
def test_argv_is_arranged(argv: list[str], arranged: list[str]) -> None:
    assert arrange_argv(build_parser(), argv) == arranged


def test_global_options_before_the_command(root: Path, tmp_path: Path, capsys) -> None:
    code, out, err = run(capsys, "--root", str(root), "ls")
    assert code == 0 and "tiny" in out, err
    code, out, _ = run(capsys, "--json", f"--root={root}", "ls")
    assert code == 0 and [r["names"] for r in json.loads(out)] == [["tiny"]]
    cfg = tmp_path / "cs.toml"
    cfg.write_text(f'[store]\nroot = "{root}"\n')
    code, out, _ = run(capsys, "--config", str(cfg), "--progress", "none", "path", "tiny")
    assert code == 0 and out.splitlines()[-1] == str(root / "models" / FIXTURE_DIGEST)
    code, out, _ = run(capsys, "--root", str(root), "--socket", str(tmp_path / "no.sock"), "--json", "gc",
                       "--dry-run")
    assert code == 0 and json.loads(out)["ran_in"] == "this process"


def test_an_option_the_command_does_not_take_is_refused_wherever_it_is(root: Path, capsys) -> None:
    for argv in (["--progress", "none", "ls", "--root", str(root)], ["ls", "--progress", "none", "--root", str(root)]):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 2
        assert "unrecognized arguments: --progress none" in capsys.readouterr().err


# -- bad values and paths -------------------------------------------------------


@pytest.mark.parametrize("argv,code,message", [
    (["gc", "--local", "--max-size", "-5G"], 4, "invalid size '-5G': a size must be positive"),
    (["gc", "--local", "--min-free", "-1G"], 4, "invalid size '-1G': a size must be positive"),
    (["gc", "--local", "--grace", "-1h"], 4, "invalid duration '-1h': a duration must be positive"),
    (["path", "f1ca"], 3, "no carton matches 'f1ca' (not a known manifest hash, hash prefix or name; "
                          "a hash prefix needs at least 8 hex digits)"),
])
def test_bad_values_are_named(argv: list[str], code: int, message: str, root: Path, capsys) -> None:
    before = snapshot(root)
    got, out, err = run(capsys, *argv, "--root", str(root))
    assert got == code and err.startswith(f"cartonstore {argv[0]}: error: {message}") and out == "", err
    assert snapshot(root) == before


def test_a_truncated_carton_is_named(root: Path, tmp_path: Path, capsys) -> None:
    half = tmp_path / "half.carton"
    half.write_bytes(FIXTURE_CARTON.read_bytes()[: FIXTURE_CARTON.stat().st_size // 2])
    before = snapshot(root)
    code, _, err = run(capsys, "add", str(half), "--root", str(root), "--progress", "none")
    assert code == 4 and err.startswith(f"cartonstore add: error: {half}: not a zip file, or truncated"), err
    assert snapshot(root) == before


@pytest.mark.parametrize("where,problem", [
    ("missing/x.carton", "directory {d}/missing does not exist"),
    ("afile/x.carton", "{d}/afile is not a directory"),
    (".", "it is a directory"),
])
def test_export_to_a_path_that_cannot_be_written_exits_4(where: str, problem: str, root: Path, tmp_path: Path,
                                                         capsys) -> None:
    (tmp_path / "afile").write_bytes(b"")
    out_path = tmp_path / where
    code, _, err = run(capsys, "export", "tiny", "-o", str(out_path), "--root", str(root))
    assert code == 4, err
    assert err.startswith(f"cartonstore export: error: cannot write {out_path}: "
                          + problem.format(d=tmp_path)), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "root"]


# -- a second daemon -----------------------------------------------------------


def test_a_second_serve_on_a_live_socket_prints_only_the_conflict(daemon: DaemonProcess) -> None:
    second = subprocess.run([sys.executable, "-m", "cartonstore.cli", "serve", "--root", str(daemon.root),
                             "--socket", str(daemon.socket_path)], capture_output=True, text=True, timeout=60)
    assert second.returncode == 7
    assert second.stderr == f"cartonstore serve: error: another daemon is already serving {daemon.socket_path}\n"
    assert second.stdout == ""

    async def live() -> int:
        async with unix_session(daemon.socket_path) as session, session.get("/v2/health/live") as r:
            return r.status
    assert asyncio.run(live()) == 200, "the first daemon still serves"


# -- one command's parser ---------------------------------------------------------
# main() builds only the parser of the command it runs (cli/parser.py); it
# must read every argv, and show every help, as the whole parser does.


subparsers = _commands


def examples() -> list[list[str]]:
    """Each command's documented example, as argv."""
    return [shlex.split(example)[1:] for _help, example, *_ in COMMANDS.values()]


@pytest.mark.parametrize("argv", [
    ["path", "m", "--root", "/r", "--json", "--progress", "json", "--mirror", "http://a", "--mirror", "http://b"],
    ["add", "f.carton", "--name", "n", "--lazy", "--allow-host", "*.example.com"],
    ["gc", "--max-size", "-5G", "--dry-run", "--forget-unrecoverable"],
    ["export", "m", "-o", "out.carton", "--links", "http://cdn", "--link-min-size", "1M"],
    ["infer", "m", "--input", "x=a.npy", "--input", "k=[1]", "--socket", "/s"],
    ["serve", "--listen", "127.0.0.1:0", "--log-format", "json"],
    ["ls"], ["verify", "--repair"], ["selftest", "m", "--rtol", "0.1"], ["pack", "d", "-o", "x"],
    *examples(),
])
def test_one_commands_parser_reads_argv_as_the_whole_parser_does(argv: list[str]) -> None:
    whole, one = build_parser(), build_parser(only=argv[0])
    assert vars(one.parse_args(arrange_argv(one, argv))) == vars(whole.parse_args(arrange_argv(whole, argv)))
    assert list(subparsers(one)) == [argv[0]]


@pytest.mark.parametrize("columns", ["0", "-5", "wide"])
def test_a_columns_value_that_is_no_width_is_ignored_as_shutil_does(monkeypatch, columns: str) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    expected = subparsers(build_parser(only="path"))["path"].format_help()
    monkeypatch.setenv("COLUMNS", columns)
    monkeypatch.setattr("os.get_terminal_size", lambda *_a: os.terminal_size((80, 24)))
    assert subparsers(build_parser(only="path"))["path"].format_help() == expected


def test_the_compression_choices_are_the_writers() -> None:
    from cartonstore.cli.parser import COMPRESSION_NAMES
    from cartonstore.zipfmt import COMPRESSION_METHODS

    assert set(COMPRESSION_NAMES) == set(COMPRESSION_METHODS)


def test_only_a_known_command_has_a_parser_of_its_own() -> None:
    with pytest.raises(ValueError, match="no command 'pth'"):
        build_parser(only="pth")


def test_one_commands_help_is_the_whole_parsers() -> None:
    whole = subparsers(build_parser())
    for name, sp in whole.items():
        assert subparsers(build_parser(only=name))[name].format_help() == sp.format_help(), name


def test_a_mistyped_command_is_named_by_the_whole_parser(capsys) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["pth", "m"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "invalid choice: 'pth'" in err and "path" in err


def test_every_command_has_a_handler_and_every_handler_a_command() -> None:
    from cartonstore.cli.commands import HANDLERS
    from cartonstore.cli.parser import COMMANDS

    assert list(HANDLERS) == list(COMMANDS)
