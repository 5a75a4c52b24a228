"""Helpers for the crash (SIGKILL) and stress tests.

* ``Carton``: a prebuilt carton and exactly what its model directory must hold.
* ``cli_argv`` / ``run_cli`` / ``spawn_and_kill``: real ``cartonstore`` CLI
  processes (``python -m cartonstore.cli``), run to the end or SIGKILLed
  after a chosen delay.
* ``model_dir_problems``: a model directory compared file by file with its
  MANIFEST (names, types and sha256 of the bytes).
* ``age_tmp`` / ``collect_leftovers``: make crash leftovers in tmp/ old
  enough for gc, collect, and check that only owner locks remain.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conftest import MINIMAL_TOML, manifest_for, sha

from cartonstore.store import Store, VerifyReport
from cartonstore.store.gc.plan import TMP_MIN_AGE, GcPolicy

PY = sys.executable


def toml_for(model_name: str) -> bytes:
    """carton.toml of MINIMAL_TOML with its own model_name (the default name
    `add` gives the carton), so cartons do not steal each other's name."""
    return MINIMAL_TOML.replace(b'"tiny"', f'"{model_name}"'.encode())


@dataclass
class Carton:
    """A carton built for a test: where it comes from and what it holds."""

    label: str
    source: str                     # a local .carton path or an http URL
    files: dict[str, bytes]         # every file MANIFEST lists, carton.toml included
    manifest: bytes = field(init=False)

    def __post_init__(self) -> None:
        self.manifest = manifest_for(self.files)

    @property
    def digest(self) -> str:
        return sha(self.manifest)

    @property
    def size(self) -> int:
        return sum(len(d) for d in self.files.values())

    def expected(self) -> dict[str, str]:
        """path -> sha256 of every file the model directory must hold."""
        out = {p: sha(d) for p, d in self.files.items()}
        out["MANIFEST"] = self.digest
        return out


# -- processes ------------------------------------------------------------------


def cli_argv(root: Path, *args: str) -> list[str]:
    return [PY, "-m", "cartonstore.cli", *args, "--root", str(root)]


def cli_env() -> dict[str, str]:
    """The test's environment without settings that would point the CLI at
    another store, socket or config file."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("CARTONSTORE_ROOT", "CARTONSTORE_SOCKET", "CARTONSTORE_CONFIG")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_cli(argv: list[str], timeout: float = 120.0) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=cli_env())


@dataclass(frozen=True)
class KillOutcome:
    delay: float
    killed_alive: bool      # False: the process had already exited when the signal was due
    returncode: int
    stderr: str


def spawn_and_kill(argv: list[str], delay: float) -> KillOutcome:
    """Start argv, sleep ``delay`` seconds, SIGKILL it if it still runs."""
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=cli_env())
    try:
        deadline = time.monotonic() + delay
        while True:  # sleep in slices so a process that ended early is noticed
            left = deadline - time.monotonic()
            if left <= 0 or proc.poll() is not None:
                break
            time.sleep(min(left, 0.01))
        alive = proc.poll() is None
        if alive:
            os.kill(proc.pid, signal.SIGKILL)
        _, err = proc.communicate(timeout=60)
    except BaseException:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        raise
    return KillOutcome(delay, alive, proc.returncode, err or "")


def timed(fn, *a, **kw) -> tuple[Any, float]:
    t0 = time.monotonic()
    result = fn(*a, **kw)
    return result, time.monotonic() - t0


# -- checks ---------------------------------------------------------------------------


def hash_path(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def model_dir_problems(path: Path, carton: Carton) -> list[str]:
    """Differences between a model directory and its carton: missing, extra,
    non-regular or wrong files (every file is read and hashed)."""
    expected = carton.expected()
    problems: list[str] = []
    if not path.is_dir():
        return [f"{path} is not a directory"]
    seen = set()
    for dirpath, dirnames, filenames in os.walk(path):
        for n in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            full = os.path.join(dirpath, n)
            rel = os.path.relpath(full, path)
            seen.add(rel)
            if rel not in expected:
                problems.append(f"{rel}: not in MANIFEST")
            elif os.path.islink(full) or not os.path.isfile(full):
                problems.append(f"{rel}: not a regular file")
            elif (got := hash_path(Path(full))) != expected[rel]:
                problems.append(f"{rel}: sha256 {got}, MANIFEST says {expected[rel]}")
    problems += [f"{p}: missing" for p in sorted(set(expected) - seen)]
    if (path / "MANIFEST").is_file() and (path / "MANIFEST").read_bytes() != carton.manifest:
        problems.append("MANIFEST bytes differ from the carton's")
    return problems


def verify_problems(report: VerifyReport) -> list[str]:
    """What makes a VerifyReport fail (orphans, unindexed blobs and the like
    are crash leftovers, allowed: they are gc's job)."""
    out = [f"corrupt blob {d}" for d in report.corrupt_blobs]
    out += [f"missing blob (indexed, no file) {d}" for d in report.missing_blobs]
    out += [f"stray file in blobs/ {p}" for p in report.stray_files]
    out += [f"damaged model {d}: {'; '.join(p[:4])}{' ...' if len(p) > 4 else ''}"
            for d, p in report.damaged_models.items()]
    return out


def age_tmp(root: Path) -> int:
    """Set the mtime of every tmp/ entry into the past; returns how many."""
    tmp = root / "tmp"
    old = time.time() - TMP_MIN_AGE - 60
    n = 0
    for e in os.scandir(tmp):
        try:
            os.utime(e.path, (old, old), follow_symlinks=False)
            n += 1
        except FileNotFoundError:
            pass
    return n


def tmp_entries(root: Path) -> list[str]:
    return sorted(os.listdir(root / "tmp"))


def collect_leftovers(store: Store, ctx: str) -> None:
    """Collect crash leftovers and check nothing but owner locks is left in
    tmp/, and that the store holds no unindexed blob or orphan model.

    gc only removes a tmp/ entry older than TMP_MIN_AGE (60 s): a younger one
    may belong to a process that created it but has not locked its owner
    token yet. Our crashes are seconds old, and waiting a minute per run is
    not an option, so the entries' mtime is moved into the past first. Their
    owners are dead (SIGKILLed), so gc may take them; a live owner's entries
    would still be protected by its owner lock, whatever their age."""
    age_tmp(store.root)
    store.collect(GcPolicy(grace=0))
    left = [n for n in tmp_entries(store.root) if not (n.startswith("owner-") and n.endswith(".lock"))]
    assert not left, f"{ctx}: gc left these in tmp/: {left}"
    report = store.verify()
    assert report.ok, f"{ctx}: verify after gc: {verify_problems(report)}"
    assert not report.unindexed_blobs, f"{ctx}: gc left unindexed blobs {report.unindexed_blobs[:5]}"
    assert not report.orphan_models, f"{ctx}: gc left orphan model dirs {report.orphan_models}"
