"""The getting-started page's quick start and the models page's "Pack,
add, serve, infer", followed as written: the commands are taken from their
code blocks, not copied here; the README's quick start is the
getting-started page's, block for block. `.venv/bin/`
and a bare `cartonstore` become this interpreter's `-m cartonstore.cli`
(the test runs inside the virtualenv the second quick-start command made);
the virtualenv and pip steps themselves are what CI runs."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from kit.daemonkit import wait_for
from kit.inferkit import runner_pids

REPO = Path(__file__).resolve().parents[2]
CLI = f"{sys.executable} -m cartonstore.cli"


def blocks(path: Path, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", path.read_text(), re.S)


def section(path: Path, title: str) -> Path:
    """A scratch file holding one section of ``path`` (its code blocks are searched)."""
    text = path.read_text()
    start = text.index(title)
    end = text.find("\n## ", start + len(title))
    return _scratch(text[start:end if end != -1 else None])


_SCRATCH: list[Path] = []


def _scratch(text: str) -> Path:
    import tempfile

    fd, name = tempfile.mkstemp(suffix=".md")
    os.write(fd, text.encode())
    os.close(fd)
    _SCRATCH.append(Path(name))
    return Path(name)


def as_run_here(line: str) -> str:
    line = line.replace(".venv/bin/cartonstore", CLI)
    return re.sub(r"(^|[;&|]\s*)cartonstore ", lambda m: m.group(1) + CLI + " ", line)


def quick_start_blocks(path: Path) -> list[str]:
    text = path.read_text()
    start = text.index("## Quick start\n")
    end = text.find("\n## ", start + 1)
    return re.findall(r"```\w*\n.*?```", text[start:end if end != -1 else None], re.S)


def test_the_readme_quick_start_is_the_getting_started_one() -> None:
    readme = quick_start_blocks(REPO / "README.md")
    assert readme and readme == quick_start_blocks(REPO / "docs" / "getting-started.md")


@pytest.mark.slow
def test_the_quick_start_as_written(short_tmp: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CARTONSTORE_")}
    env.update(HOME=str(short_tmp), XDG_CACHE_HOME=str(short_tmp / "cache"), CARTONSTORE_SANDBOX="none")
    quick = section(REPO / "docs" / "getting-started.md", "## Quick start")
    serve_line = blocks(quick, "sh")[0].splitlines()[0]
    command = as_run_here(serve_line.rsplit("&&", 1)[1].strip())   # after the venv and the install
    assert command == f"{CLI} serve"
    daemon = subprocess.Popen("exec " + command, shell=True, cwd=REPO, env=env, start_new_session=True,
                              stderr=subprocess.PIPE, text=True)
    socket_path = short_tmp / "cache" / "cartonstore" / "cartonstore.sock"   # the embedded default
    try:
        assert wait_for(lambda: socket_path.exists() or daemon.poll() is not None, 60)
        assert daemon.poll() is None, daemon.stderr.read()
        script = blocks(quick, "sh")[1]
        done = subprocess.run(["bash", "-e", "-c", as_run_here(script)], cwd=REPO, env=env, capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        answer = blocks(quick, "text")[0].splitlines()   # what the page says the CLI and curl print
        assert answer and set(answer) <= set(done.stdout.splitlines()), done.stdout
    finally:
        os.killpg(daemon.pid, signal.SIGTERM)
        daemon.wait(30)
    assert daemon.returncode == 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_making_a_carton_as_written(short_tmp: Path) -> None:
    doc = REPO / "docs" / "models-and-cartons.md"
    python_part = section(doc, "**python**")
    (short_tmp / "my-carton" / "model").mkdir(parents=True)
    (short_tmp / "my-carton" / "carton.toml").write_text(blocks(python_part, "toml")[0])
    (short_tmp / "my-carton" / "model" / "main.py").write_text(blocks(python_part, "python")[0])
    steps = section(doc, "## Pack, add, serve, infer")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CARTONSTORE_")}
    port = _free_port()
    env.update(CARTONSTORE_ROOT=str(short_tmp / "root"), CARTONSTORE_SANDBOX="none")
    daemon = None
    try:
        for line in blocks(steps, "sh")[0].splitlines():
            command = as_run_here(line.split("#", 1)[0].strip()).replace("127.0.0.1:8000", f"127.0.0.1:{port}")
            if " serve" in command:
                daemon = subprocess.Popen("exec " + command, shell=True, cwd=short_tmp, env=env,
                                          start_new_session=True)
                continue
            done = subprocess.run(command, shell=True, cwd=short_tmp, env=env, capture_output=True, text=True,
                                  timeout=120)
            assert done.returncode == 0, (command, done.stderr)
        assert daemon is not None

        def listening() -> bool:
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", port)) == 0
        assert wait_for(listening, 60)
        client = blocks(steps, "python")[0].replace("127.0.0.1:8000", f"127.0.0.1:{port}")
        done = subprocess.run([sys.executable, "-c", client], capture_output=True, text=True, timeout=120, env=env)
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == ["[[2.", "2.", "2.", "2.]", "[2.", "2.", "2.", "2.]]"], done.stdout
    finally:
        if daemon is not None:
            os.killpg(daemon.pid, signal.SIGTERM)
            daemon.wait(30)
        for path in _SCRATCH:
            path.unlink(missing_ok=True)
    assert daemon.returncode == 0
    assert wait_for(lambda: not runner_pids(short_tmp / "root"), 10)
