#!/usr/bin/env python3
"""Benchmark: how long the CLI takes to start and answer a quick command.

Target (issue 14): `cartonstore path NAME` of a carton whose model directory
is already built answers in <= 100 ms wall. Baseline in the same run: the
interpreter alone (`python -c pass`); also timed: `cartonstore --help` and
`cartonstore ls` on the same store (one carton).

Every round runs each command once, in turn, so that load from elsewhere
falls on all of them alike; min and median over the rounds are printed, wall
time and the child's CPU time (user + system: less disturbed by other work
on a busy machine). Children find their .pyc in a cache of their own
(PYTHONPYCACHEPREFIX, warmed first), as an installed package finds its own,
even where PYTHONDONTWRITEBYTECODE is set; --no-bytecode-cache compiles
every module in every run instead.

The commands run as an installed cartonstore runs (--layout installed, the
default): a virtualenv made here puts the repository on sys.path as a
directory, as `pip install` does. This development venv's editable install
imports pathlib, urllib.parse and ipaddress at every interpreter start, in
`python -c pass` too; --layout editable measures it as it is. A "stdlib
floor" line times the standard modules this CLI's design needs (argparse,
json, dataclasses, sqlite3, typing) with nothing else.

    python tests/bench/bench_cli.py [--rounds 20] [--no-bytecode-cache] [--layout installed|editable]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()
REPO = HERE.parents[2]
sys.path.insert(0, str(REPO))

from cartonstore.store import Store
from cartonstore.store.materialize.tree import remove_tree

TOML = b'spec_version = 1\nmodel_name = "m"\n[runner]\nrunner_name = "x"\nrequired_framework_version = "1"\n'
TARGET_MS = 100.0
STDLIB_FLOOR = "import argparse, dataclasses, sqlite3, typing"  # what `path` imports (no json since issue 14)


def make_store(work: Path) -> Path:
    """A store holding one small carton, named demo, its model directory built."""
    src = work / "demo"
    (src / "model").mkdir(parents=True)
    (src / "carton.toml").write_bytes(TOML)
    (src / "model" / "weights.bin").write_bytes(os.urandom(1 << 20))
    with Store(work / "root") as store:
        store.add(src, name="demo")
        store.materialize("demo")
    return work / "root"


def installed_layout(work: Path) -> tuple[str, list[str]]:
    """(python, the cartonstore command) of a virtualenv where cartonstore
    sits on sys.path as a regular install puts it (a plain directory entry),
    with this environment's dependencies. The development venv's editable
    install adds a meta-path finder that imports pathlib, urllib.parse and
    ipaddress at every start, in `python -c pass` too (about 15 ms here),
    which no installed cartonstore has."""
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = subprocess.check_output([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                      text=True).strip()
    deps = [p for p in sys.path if p.endswith("site-packages")]
    Path(purelib, "cartonstore-bench.pth").write_text("\n".join([str(REPO), *deps]) + "\n")
    script = venv / "bin" / "cartonstore"  # what pip writes for the console script
    script.write_text(f"#!{python}\nimport sys\nfrom cartonstore.cli import main\nsys.exit(main())\n")
    script.chmod(0o755)
    return str(python), [str(script)]


def child_env(work: Path, bytecode_cache: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CARTONSTORE_")}
    env["PYTHONPATH"] = str(REPO)
    if bytecode_cache:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(work / "pycache")
    else:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def run_once(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one child."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, check=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--no-bytecode-cache", action="store_true",
                    help="compile every module in every run (as with PYTHONDONTWRITEBYTECODE and no .pyc)")
    ap.add_argument("--layout", choices=["installed", "editable"], default="installed",
                    help="installed (default): cartonstore on sys.path as pip install puts it, in a venv made "
                         "here; editable: this environment as it is (its editable install's finder included)")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="cs-bench-cli-"))
    try:
        root = make_store(work)
        env = child_env(work, not a.no_bytecode_cache)
        if a.layout == "installed":
            python, cli = installed_layout(work)
            env.pop("PYTHONPATH")
        else:
            python = sys.executable
            script = Path(sys.executable).with_name("cartonstore")  # what a user runs, as tests/cli/test_cli.py does
            cli = [str(script)] if script.exists() else [sys.executable, "-m", "cartonstore.cli"]
        commands = {
            "python -c pass": [python, "-c", "pass"],
            # The standard library a CLI of this design cannot avoid: argument
            # parsing, JSON, dataclasses (they import inspect) and SQLite.
            "python: stdlib floor": [python, "-c", STDLIB_FLOOR],
            "cartonstore --help": [*cli, "--help"],
            "cartonstore path demo": [*cli, "path", "demo", "--root", str(root)],
            "cartonstore ls": [*cli, "ls", "--root", str(root)],
        }
        for cmd in commands.values():  # warm-up: the page cache, and the .pyc cache when there is one
            run_once(cmd, env)
        walls: dict[str, list[float]] = {name: [] for name in commands}
        cpus: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(a.rounds):
            for name, cmd in commands.items():
                wall, cpu = run_once(cmd, env)
                walls[name].append(wall * 1000)
                cpus[name].append(cpu * 1000)
        base = min(walls["python -c pass"])
        print(f"{a.rounds} rounds, {'no ' if a.no_bytecode_cache else ''}bytecode cache, {a.layout} layout, "
              f"{cli[0]}")
        print(f"{'command':24} {'wall min':>9} {'median':>7} {'cpu min':>8} {'median':>7}   min wall vs python -c pass")
        for name in commands:
            w, c = walls[name], cpus[name]
            print(f"{name:24} {min(w):7.1f}ms {statistics.median(w):5.1f}ms {min(c):6.1f}ms {statistics.median(c):5.1f}ms"
                  f"   {min(w) / base:4.1f}x (+{min(w) - base:.1f} ms)")
        path = walls["cartonstore path demo"]
        floor = min(walls["python: stdlib floor"])
        print(f"path beyond the stdlib floor ({STDLIB_FLOOR}): +{min(path) - floor:.1f} ms "
              f"(the floor is +{floor - base:.1f} ms over python -c pass)")
        met = "met" if min(path) <= TARGET_MS else "NOT met"
        print(f"target: path <= {TARGET_MS:.0f} ms: min {min(path):.1f} ms, median {statistics.median(path):.1f} ms "
              f"-> {met} (by the min; median {'met' if statistics.median(path) <= TARGET_MS else 'not met'})")
    finally:
        remove_tree(work)


if __name__ == "__main__":
    main()
