"""What the daemon says in its log (issue 15, section 5): a line for every
request answered with an error (method, path, status, reason), for loads,
unloads and collections; a line per request only with access_log on."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from conftest import FIXTURE_CARTON
from kit.daemonkit import DaemonProcess


def _call(d: DaemonProcess, method: str, path: str, body: dict | None = None) -> int:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(d.http_url + path, data=data, method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            resp.read()
            return resp.status
    except urllib.error.HTTPError as e:
        e.read()
        return e.code


def _log_of(d: DaemonProcess) -> str:
    assert d.stop() == 0
    return d.proc.stderr.read()


@pytest.mark.slow
def test_errors_loads_unloads_and_collections_each_leave_a_line(short_tmp: Path) -> None:
    config = short_tmp / "cartonstore.toml"   # the loads below name paths, and come over TCP
    config.write_text("[server]\nallow_tcp_local_sources = true\n")
    d = DaemonProcess(short_tmp / "root", extra_args=["--config", str(config)]).start()
    try:
        missing = short_tmp / "no-such.carton"
        assert _call(d, "POST", "/v2/repository/models/ghost/load",
                     {"parameters": {"source": str(missing)}}) == 404
        assert _call(d, "POST", "/v2/repository/models/bad%20name/load",
                     {"parameters": {"source": str(FIXTURE_CARTON)}}) == 400
        assert _call(d, "GET", "/v2/models/nobody/ready") == 400
        assert _call(d, "POST", "/v2/repository/models/tiny/load",
                     {"parameters": {"source": str(FIXTURE_CARTON)}}) == 200
        assert _call(d, "GET", "/v2") == 200
        assert _call(d, "POST", "/v2/repository/models/tiny/unload", {}) == 200
        assert _call(d, "POST", "/v1/gc", {"grace": 0}) == 200
    finally:
        log = _log_of(d)
    lines = log.splitlines()

    def line_with(*parts: str) -> str:
        found = [x for x in lines if all(p in x for p in parts)]
        assert found, f"no log line with {parts}:\n{log}"
        return found[0]

    line_with("POST /v2/repository/models/ghost/load -> 404", str(missing))
    line_with("load of ghost failed")
    line_with("POST /v2/repository/models/bad%20name/load -> 400", "invalid name")
    assert not [x for x in lines if "/ready -> 400" in x], "a 'not ready' that clients poll for is debug only"
    line_with("model tiny version", "loaded")
    line_with("model tiny unloaded")
    line_with("gc in", "freed")
    assert not [x for x in lines if "GET /v2 ->" in x], "a success is logged only with access_log on"


def test_at_debug_level_a_not_ready_poll_is_logged_too(short_tmp: Path) -> None:
    d = DaemonProcess(short_tmp / "root", extra_args=["--log-level", "debug"]).start()
    try:
        assert _call(d, "GET", "/v2/models/nobody/ready") == 400
    finally:
        log = _log_of(d)
    assert "GET /v2/models/nobody/ready -> 400: model 'nobody' is not ready" in log, log


def test_access_log_adds_a_line_per_request(short_tmp: Path) -> None:
    d = DaemonProcess(short_tmp / "root", env={"CARTONSTORE_ACCESS_LOG": "true"}).start()
    try:
        assert _call(d, "GET", "/v2") == 200
        assert _call(d, "GET", "/v2/health/live") == 200
    finally:
        log = _log_of(d)
    assert "GET /v2 -> 200 in" in log and "GET /v2/health/live -> 200 in" in log, log
