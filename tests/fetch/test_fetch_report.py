"""What `cartonstore add` says while and after it fetches (issue 15 §2, §3):
progress with bytes and the total in every mode, also through Range parts;
the blobs, bytes, requests and sources it reports; each retry, in words."""

from __future__ import annotations

import json
import os
import re
import socket
from pathlib import Path

import pytest
from conftest import FIXTURE_CARTON, MINIMAL_TOML
from kit.fetchkit import linked_carton
from kit.origin import Fault

from cartonstore.carton.pack import pack_directory
from cartonstore.cli.commands import main
from cartonstore.cli.progress import JSON_INTERVAL

STALL = 1.2  # longer than any progress interval: an update falls inside every stall


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def json_lines(err: str) -> list[dict]:
    return [json.loads(line) for line in err.splitlines() if line.startswith("{")]


def settings(tmp_path: Path, **fetch: str | int) -> str:
    path = tmp_path / "cs.toml"
    path.write_text("[fetch]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in fetch.items()))
    return str(path)


def blob_count(root: Path) -> int:
    return sum(1 for p in (root / "blobs").rglob("*") if p.is_file())


def packed(tmp_path: Path, files: dict[str, bytes]) -> Path:
    src = tmp_path / "src"
    (src / "model").mkdir(parents=True)
    (src / "carton.toml").write_bytes(MINIMAL_TOML)
    for name, data in files.items():
        (src / "model" / name).write_bytes(data)
    return pack_directory(src, tmp_path / "m.carton", compression="stored").path


@pytest.mark.slow
def test_a_carton_by_url_shows_bytes_and_total_as_they_arrive(tmp_path: Path, origin, capsys) -> None:
    origin.put_file("/m.carton", packed(tmp_path, {"w.bin": os.urandom(6 << 20)}),
                    fault=Fault(stall_at=3 << 20, stall_seconds=STALL))
    code, out, err = cli(capsys, "add", origin.url("/m.carton"), "--root", str(tmp_path / "r"),
                         "--progress", "json", "--json")
    assert code == 0, err
    result, events = json.loads(out), json_lines(err)
    done = events[-1]
    assert done["event"] == "done" and done["bytes"] == done["total"] == result["bytes_received"] == origin.bytes_sent
    progress = [e for e in events if e["event"] == "progress"]
    assert any(e["total"] == done["total"] and 0 < e["bytes"] < e["total"] for e in progress), progress
    assert all(e["total"] is None or e["bytes"] <= e["total"] for e in progress)
    assert [e["bytes"] for e in progress] == sorted(e["bytes"] for e in progress)
    assert len(progress) <= done["seconds"] / JSON_INTERVAL + 2, "updates are throttled"


@pytest.mark.parametrize("mode", ["json", "plain", "bar"])
def test_a_blob_in_parallel_range_parts_shows_progress_in_every_mode(tmp_path: Path, origin, capsys,
                                                                     mode: str) -> None:
    payload = os.urandom(4 << 20)
    carton, shas = linked_carton(tmp_path, origin, {"model/w.bin": payload})
    path = f"/blobs/{shas['model/w.bin']}"
    origin.set_fault(path, Fault(stall_at=512 << 10, stall_seconds=STALL))
    cfg = settings(tmp_path, parallel_threshold="1MiB", parallel_parts=4)
    code, out, err = cli(capsys, "add", str(carton), "--config", cfg, "--root", str(tmp_path / "r"),
                         "--progress", mode, "--json")
    assert code == 0, err
    assert len([r for r in origin.requests if r.path == path and r.range]) == 3, "fetched as 4 parts"
    received = json.loads(out)["bytes_received"]
    assert received >= len(payload)
    if mode == "json":
        events = json_lines(err)
        assert any(e["event"] == "progress" and e["total"] == len(payload) and 0 < e["bytes"] < len(payload)
                   for e in events), events
        assert events[-1]["event"] == "done" and events[-1]["bytes"] == events[-1]["total"] == received
    elif mode == "plain":
        partial = re.findall(r"^fetched ([\d.]+) (KiB|MiB) of 4\.0 MiB \(", err, re.M)
        assert any(unit == "KiB" or float(n) < 4 for n, unit in partial), err
        assert re.search(r"^transferred [4-9]\.\d MiB in ", err, re.M), err  # the first part's body may run on
    else:
        partial = re.findall(r"([\d.]+)([kM]?)/4\.00M", err)
        assert any(unit != "M" or float(n) < 4 for n, unit in partial), err
        assert re.search(r"\d+%\|", err), err  # a bar with a percentage: the total was known


def _refused_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/m.carton"


def test_each_retry_is_shown_without_library_internals(tmp_path: Path, capsys) -> None:
    url = _refused_url()
    cfg = settings(tmp_path, retries=2, backoff_base="10ms", backoff_max="20ms")
    code, _, err = cli(capsys, "add", url, "--config", cfg, "--root", str(tmp_path / "r"), "--progress", "json")
    assert code != 0
    retries = [e for e in json_lines(err) if e["event"] == "retry"]
    assert [(e["attempt"], e["retries"], e["reason"]) for e in retries] == [(1, 2, "connection refused"),
                                                                            (2, 2, "connection refused")]
    assert re.fullmatch(r"retry 2/2 in 0\.0 s: connection refused", retries[1]["message"])
    assert retries[0]["url"] == url and 0 < retries[0]["delay"] <= 0.02
    code, _, err = cli(capsys, "add", url, "--config", cfg, "--root", str(tmp_path / "r"), "--progress", "plain")
    lines = [line for line in err.splitlines() if line.startswith("retry ")]
    assert lines == [f"retry 1/2 in 0.0 s: connection refused ({url})", f"retry 2/2 in 0.0 s: connection refused ({url})"]
    assert "ssl" not in "".join(lines) and "Connect call" not in "".join(lines)


def test_retries_of_a_pull_that_succeeds_are_shown_and_counted(tmp_path: Path, origin, capsys) -> None:
    origin.put("/m.carton", FIXTURE_CARTON.read_bytes(), fault=Fault(status_sequence=[503, 503]))
    cfg = settings(tmp_path, retries=3, backoff_base="10ms", backoff_max="20ms")
    code, out, err = cli(capsys, "add", origin.url("/m.carton"), "--config", cfg, "--root", str(tmp_path / "r"),
                         "--progress", "plain")
    assert code == 0, err
    shown = re.findall(r"^retry (\d)/3 in 0\.0 s: (.*) \(http://", err, re.M)
    assert [n for n, _ in shown] == ["1", "2"] and all("503" in why for _, why in shown), err
    assert ", 2 retries, " in out.splitlines()[0]
    origin.set_fault("/m.carton", Fault(status_sequence=[503, 503]))
    before = len(origin.requests)
    code, out, err = cli(capsys, "add", origin.url("/m.carton"), "--config", cfg, "--root", str(tmp_path / "r2"),
                         "--progress", "none", "--json")
    r = json.loads(out)
    assert r["retries"] == 2 and r["requests"] == len(origin.requests) - before, "the refused requests count too"


def test_add_by_url_reports_the_blobs_bytes_and_requests_it_took(tmp_path: Path, origin, capsys) -> None:
    origin.put_file("/m.carton", packed(tmp_path, {f"w{i}.bin": os.urandom(300_000) for i in range(4)}))
    root = tmp_path / "r"
    _code, out, _ = cli(capsys, "add", origin.url("/m.carton"), "--root", str(root), "--json", "--progress", "none")
    r = json.loads(out)
    assert r["blobs_fetched"] == blob_count(root) == 6  # 4 files, carton.toml, MANIFEST
    assert r["bytes_received"] == origin.bytes_sent and r["requests"] == len(origin.requests)
    assert r["sources"] == {"file": {"bytes": 0, "blobs": 0}, "mirror": {"bytes": 0, "blobs": 0},
                            "registry": {"bytes": 0, "blobs": 0}, "peer": {"bytes": 0, "blobs": 0},
                            "hf": {"bytes": 0, "blobs": 0},
                            "url": {"bytes": r["bytes_received"], "blobs": 6}}
    assert r["bytes_read"] == 0 and r["retries"] == 0
    _code, out, _ = cli(capsys, "add", origin.url("/m.carton"), "--root", str(root), "--progress", "none")
    line = out.splitlines()[0]
    assert re.search(r"; received [\d.]+ KiB in \d request\(s\), 0 new blob\(s\), 1\.1 MiB already stored$", line), line


def test_add_says_which_bytes_came_from_which_source(tmp_path: Path, origin, capsys) -> None:
    a, b = os.urandom(300_000), os.urandom(200_000)
    carton, shas = linked_carton(tmp_path, origin, {"model/a.bin": a, "model/b.bin": b},
                                 urls={"model/b.bin": [origin.url("/gone/b.bin")]})
    origin.put(f"/mirror/{shas['model/b.bin']}", b)
    root = tmp_path / "r"
    code, out, err = cli(capsys, "add", str(carton), "--mirror", origin.url("/mirror"), "--root", str(root),
                         "--json", "--progress", "none")
    assert code == 0, err
    r = json.loads(out)
    assert r["sources"]["url"] == {"bytes": len(a), "blobs": 1}
    assert r["sources"]["mirror"] == {"bytes": len(b), "blobs": 1}
    assert r["sources"]["file"]["blobs"] == blob_count(root) - 2 and r["sources"]["file"]["bytes"] == r["bytes_read"] > 0
    assert r["blobs_fetched"] == blob_count(root)
    assert r["bytes_received"] == len(a) + len(b) and r["requests"] == len(origin.requests) == 3  # one 404
    code, out, err = cli(capsys, "add", str(carton), "--mirror", origin.url("/mirror"), "--root",
                         str(tmp_path / "r2"), "--progress", "none")
    assert "received 488.3 KiB in 3 request(s) (url 293.0 KiB, mirror 195.3 KiB)" in out.splitlines()[0], out


def test_a_local_add_says_what_it_read_and_what_was_already_stored(tmp_path: Path, capsys) -> None:
    root = tmp_path / "r"
    _code, out, _ = cli(capsys, "add", str(FIXTURE_CARTON), "--root", str(root))
    line = out.splitlines()[0]
    m = re.search(r"; read ([\d.]+ [KM]iB) from disk, (\d+) new blob\(s\), 0 B already stored$", line)
    assert m and int(m.group(2)) == blob_count(root), line
    assert "request" not in line and "transferred" not in line
    _code, out, _ = cli(capsys, "add", str(FIXTURE_CARTON), "--root", str(root))
    assert re.search(r"; read 0 B from disk, 0 new blob\(s\), [\d.]+ [KM]iB already stored$", out.splitlines()[0])
    _code, out, _ = cli(capsys, "add", str(FIXTURE_CARTON), "--root", str(root), "--json")
    r = json.loads(out)
    assert (r["bytes_read"], r["blobs_fetched"], r["requests"], r["bytes_received"]) == (0, 0, 0, 0)
    assert r["bytes_reused"] > 0
