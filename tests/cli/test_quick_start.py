"""The quick start (docs/getting-started.md, the README's own), followed
as written by root in a fresh container whose Python lives under a 0700
directory (a pyenv in /root), gets its answer: the first command line (a venv, `pip install .`, `serve`)
in one shell, the second block (add, load, infer with the CLI and with
curl) in another, and every line of the answer the page shows is printed.

What stands in for what:
- the clean clone: `git clone` of this repository's HEAD, with the working
  tree's uncommitted and untracked (not ignored) files copied over it, so
  that what is about to be committed is what is tested;
- the fresh container: a mount namespace of the test's own
  (kit/hostview.py) whose /var/lib and /run are overlays, so root's
  default store and socket are made there as on a new machine, and the
  host's are never touched;
- the pyenv Python under /root: this interpreter's installation
  (sys.base_prefix) bound at <tmp>/private/python, <tmp>/private mode
  0700, first on PATH, so the page's `python3` is it and the venv's
  interpreter is a path the runner user cannot reach;
- the package index: pip's own configuration on this machine, as a user's
  would be (the page's `pip install` is run as written).
The second shell joins the first one's namespace (nsenter), as a second
terminal on the same machine would be.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from kit import hostview
from kit.daemonkit import wait_for
from kit.prockit import live_pids, wait_gone

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("quick_start")]


def quick_start_blocks() -> list[tuple[str, str]]:
    """(language, text) of each code block of the getting-started page's quick start."""
    text = (REPO / "docs" / "getting-started.md").read_text()
    start = text.index("## Quick start\n")
    section = text[start:text.index("\n## ", start + 1)]
    return re.findall(r"```(\w*)\n(.*?)```", section, re.S)


def clean_clone(into: Path) -> Path:
    subprocess.run(["git", "clone", "-q", str(REPO), str(into)], check=True, capture_output=True)
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, check=True,
                            capture_output=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source, target = REPO / name, into / name
        if not os.path.lexists(source):  # deleted in the working tree, not yet in a commit
            target.unlink(missing_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        if os.path.lexists(target):
            target.unlink()
        shutil.copy2(source, target, follow_symlinks=False)
    return into


def root_env(python_bin: Path) -> dict[str, str]:
    """Root's environment as a newcomer's shell has it: nothing of cartonstore's,
    no virtualenv, the Python under the 0700 directory first on PATH."""
    drop = ("CARTONSTORE_", "XDG_CACHE_HOME", "VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    here = str(Path(sys.executable).parent)
    path = [p for p in env.get("PATH", "/usr/bin:/bin").split(":") if p and p != here]
    return {**env, "PATH": ":".join([str(python_bin), *path])}


@pytest.mark.skipif(hostview.why_not() is not None, reason=str(hostview.why_not()))
def test_the_quick_start_as_root_in_a_clean_clone(short_tmp: Path) -> None:
    blocks = quick_start_blocks()
    serve_line = blocks[0][1].splitlines()[0]
    second_shell = [text for lang, text in blocks if lang == "sh"][1]
    answer = next(text for lang, text in blocks if lang == "text").splitlines()
    clone = clean_clone(short_tmp / "clone")
    private = short_tmp / "private"
    private.mkdir(mode=0o700)
    python_at = private / "python"
    env = root_env(python_at / "bin")
    log = short_tmp / "first-shell.log"
    with open(log, "w") as out:
        first = subprocess.Popen(hostview.argv(short_tmp / "view", ["bash", "-c", serve_line],
                                               binds={Path(sys.base_prefix): python_at}),
                                 cwd=clone, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        assert wait_for(lambda: " serving " in log.read_text() or first.poll() is not None, 600), log.read_text()
        assert first.poll() is None, log.read_text()
        served = log.read_text()
        assert "serving /var/lib/cartonstore on unix:/run/cartonstore/cartonstore.sock" in served, served
        assert "runners.sandbox = none" not in served, served
        venv_python = os.path.realpath(clone / ".venv" / "bin" / "python3")
        assert venv_python.startswith(f"{private}/"), venv_python

        done = subprocess.run(hostview.joined(first.pid, ["bash", "-e", "-c", second_shell]), cwd=clone, env=env,
                              capture_output=True, text=True, timeout=300, check=False)
        assert done.returncode == 0, (done.stderr, log.read_text())
        assert set(answer) <= set(done.stdout.splitlines()), (done.stdout, done.stderr, log.read_text())
    finally:
        daemons = live_pids(" serve", parent=first.pid)
        for pid in daemons:
            os.kill(pid, signal.SIGTERM)
        if not daemons and first.poll() is None:
            os.killpg(first.pid, signal.SIGTERM)
        first.wait(60)
        assert all(wait_gone(pid, 30) for pid in live_pids(str(clone))), "processes of the clone left running"
    assert first.returncode == 0, log.read_text()
