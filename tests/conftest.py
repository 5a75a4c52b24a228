"""Shared fixtures: real store roots in tmp dirs, real cartons on disk."""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import os
import shutil
import sqlite3
import stat
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from cartonstore.store import Store

if TYPE_CHECKING:
    from kit.daemonkit import DaemonProcess
    from kit.origin import Origin

# The CLI's tests' store (the fixture `root`), wherever a test module does not make its own.
pytest_plugins = ["kit.clikit"]

# Runners of the daemons and CLIs the suite starts run unsandboxed: the suite
# is about everything else, and as root a sandboxed runner needs a user and a
# Python that user may run. tests/server/test_sandbox.py sets its own.
os.environ.setdefault("CARTONSTORE_SANDBOX", "none")
# The origins that serve what cartons' LINKS name are on 127.0.0.1, which
# production refuses such URLs: tests/fetch/test_private_links.py tests that
# with this unset (kit/fetchkit.py's fast_config allows them too).
os.environ.setdefault("CARTONSTORE_ALLOW_PRIVATE_LINKS", "true")
# A run starts thousands of Python processes from this tree (pytest's workers,
# daemons, runners, CLIs): where the environment says not to write bytecode,
# each would compile cartonstore's modules anew, and each worker rewrite every
# test module's asserts anew. __pycache__ is ignored by git.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False
# A command a test runs with no store named (no --root, setting or
# CARTONSTORE_ROOT) must not reach the host's store, /var/lib/cartonstore as
# root: its default root is in a cache directory of this process's own,
# removed at exit. Tests of the defaults clear it (tests/cli/test_default_store.py).
os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(dir="/tmp", prefix="cs-cache-")  # short: sockets go in it
atexit.register(lambda cache=os.environ["XDG_CACHE_HOME"]: _rmtree(Path(cache)))

FIXTURES = Path(__file__).resolve().parent / "fixtures"
FIXTURE_CARTON = FIXTURES / "carton-repo-test.carton"
FIXTURE_DIGEST = "f1cae5143a92a44e3a7e1d9c32a0245065dfb6e0f1e91c18b5e44356d081dfb5"

MINIMAL_TOML = b'''spec_version = 1
model_name = "tiny"

[runner]
runner_name = "torchscript"
required_framework_version = "=2.0.0"
runner_compat_version = 1
'''


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def manifest_for(files: dict[str, bytes]) -> bytes:
    return "".join(f"{p}={sha(d)}\n" for p, d in sorted(files.items(), key=lambda kv: kv[0].encode())).encode()


def write_zip(path: Path, entries: list[tuple[str, bytes]], *, method: int = zipfile.ZIP_STORED) -> Path:
    """A zip with exactly these entries, in this order, names unchecked
    (so tests can build hostile archives)."""
    with zipfile.ZipFile(path, "w", compression=method) as z:
        for name, data in entries:
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = method
            info.external_attr = 0o100644 << 16
            z.writestr(info, data)
    return path


def carton_entries(files: dict[str, bytes], *, manifest: bytes | None = None,
                   links: bytes | None = None, omit: tuple[str, ...] = ()) -> list[tuple[str, bytes]]:
    entries = [(p, d) for p, d in files.items() if p not in omit]
    entries.append(("MANIFEST", manifest if manifest is not None else manifest_for(files)))
    if links is not None:
        entries.append(("LINKS", links))
    return entries


# A Unix socket's path is at most 107 bytes. tmp_path is not short: it is
# /tmp/pytest-of-USER/pytest-N/[popen-gwN/ under xdist]TEST_NAME_30_CHARS0/,
# longer still under --basetemp or a long $TMPDIR. So a test puts its
# sockets, and every store root a daemon or runner binds sockets in (the
# daemon's ROOT/cartonstore.sock, runners' ROOT/run/runners/*.sock, which
# need ROOT at about 68 bytes at most), under a short_dir() instead.
SHORT_BASE = "/tmp"


def _rmtree(path: Path) -> None:
    """shutil.rmtree that also gets through the store's read-only trees
    (models/ is read-only) when not running as root."""
    try:
        shutil.rmtree(path)
    except FileNotFoundError:
        pass
    except OSError:
        for dirpath, dirnames, _ in os.walk(path):
            for name in dirnames:
                sub = os.path.join(dirpath, name)
                if not os.path.islink(sub):
                    with contextlib.suppress(OSError):
                        os.chmod(sub, stat.S_IRWXU)
        shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def short_dir(prefix: str = "cs-") -> Iterator[Path]:
    """A fresh directory with a short path (/tmp/cs-XXXXXXXX), removed on
    exit: for Unix sockets and the store roots that hold them."""
    path = Path(tempfile.mkdtemp(dir=SHORT_BASE, prefix=prefix))
    try:
        yield path
    finally:
        _rmtree(path)


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """Like tmp_path, but short enough for Unix sockets whatever tmp_path's length."""
    with short_dir() as path:
        yield path


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path / "root")
    yield s
    s.close()


@pytest.fixture
def make_carton(tmp_path: Path) -> Callable[..., Path]:
    """make_carton(files, name=..., **carton_entries kwargs) -> path of a .carton."""
    counter = iter(range(10**6))

    def make(files: dict[str, bytes] | None = None, *, name: str | None = None, method: int = zipfile.ZIP_STORED,
             **kw) -> Path:
        files = dict(files if files is not None else {"carton.toml": MINIMAL_TOML, "model/weights.bin": b"w" * 100})
        files.setdefault("carton.toml", MINIMAL_TOML)
        path = tmp_path / (name or f"c{next(counter)}.carton")
        return write_zip(path, carton_entries(files, **kw), method=method)

    return make


def work_in_tmp(root: Path) -> list[str]:
    """What tmp/ holds besides the owner locks of live processes."""
    tmp = root / "tmp"
    return sorted(n for n in os.listdir(tmp) if not n.startswith("owner-")) if tmp.exists() else []


def snapshot(root: Path) -> tuple:
    """Everything observable about a store: files (with modes) and index rows."""
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        if rel.startswith(("tmp", "locks")):
            continue
        for n in filenames:
            if n.startswith("index.db"):
                continue
            p = os.path.join(dirpath, n)
            files.append((os.path.relpath(p, root), os.lstat(p).st_size))
        for n in dirnames:
            files.append((os.path.relpath(os.path.join(dirpath, n), root), "dir"))
    rows = []
    db = root / "index.db"
    if db.exists():
        conn = sqlite3.connect(db)
        for (t,) in conn.execute("SELECT name FROM sqlite_master WHERE type='table' ORDER BY name"):
            rows.append((t, sorted(conn.execute(f"SELECT * FROM {t}").fetchall())))
        conn.close()
    tmp_left = work_in_tmp(root)
    return sorted(files, key=str), rows, tmp_left


@pytest.fixture
def origin() -> Iterator[Origin]:
    """A real HTTP server on 127.0.0.1 that misbehaves on request (tests/kit/origin.py)."""
    from kit.origin import Origin

    with Origin() as o:
        yield o


@pytest.fixture
def daemon(short_tmp: Path) -> Iterator[DaemonProcess]:
    """A real `cartonstore serve` on a Unix socket and a loopback port."""
    from kit.daemonkit import DaemonProcess

    d = DaemonProcess(short_tmp / "root").start()
    yield d
    d.stop()
