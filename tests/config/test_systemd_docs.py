"""The operations page's "Under systemd" says what the unit files in systemd/ do: it
installs every one of them (the sysusers file where the units' comments
say, then runs systemd-sysusers), puts the entry point where every
ExecStart runs it, and its cron line for hosts without systemd runs what
cartonstore-gc.service runs, with the same settings file."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
UNITS = REPO / "systemd"


def section(title: str) -> str:
    text = (REPO / "docs" / "operations.md").read_text()
    start = text.index(title)
    return text[start:text.index("\n## ", start + len(title))]


def shell_blocks(text: str) -> list[str]:
    return [block.replace("\\\n", " ") for block in re.findall(r"```sh\n(.*?)```", text, re.S)]


def exec_starts() -> dict[str, list[str]]:
    return {unit.name: shlex.split(line.split("=", 1)[1])
            for unit in UNITS.glob("*.service") for line in unit.read_text().splitlines()
            if line.startswith("ExecStart=")}


def test_the_install_steps_install_every_unit_file_and_the_users() -> None:
    install = shell_blocks(section("## Under systemd"))[0]
    for unit in UNITS.iterdir():
        assert f"systemd/{unit.name}" in install, f"{unit.name} is not installed"
    assert "systemd/cartonstore.sysusers /etc/sysusers.d/cartonstore.conf" in install
    assert "/etc/sysusers.d/cartonstore.conf" in (UNITS / "cartonstore.service").read_text()
    assert "systemd-sysusers" in install and "useradd" not in install


def test_the_install_steps_put_the_entry_point_where_the_units_run_it() -> None:
    install = shell_blocks(section("## Under systemd"))[0]
    programs = {argv[0] for argv in exec_starts().values()}
    assert programs == {"/usr/local/bin/cartonstore"}
    link = re.search(r"^ln -sf (\S+) (\S+)$", install, re.M)
    assert link and link[2] == "/usr/local/bin/cartonstore", install
    venv = re.search(r"python3 -m venv (\S+)", install)
    assert venv and link[1] == f"{venv[1]}/bin/cartonstore"


def test_the_cron_line_runs_what_the_gc_timer_runs() -> None:
    cron = [line for block in shell_blocks(section("## Under systemd")) for line in block.splitlines()
            if re.match(r"^[0-9*]", line)]
    assert len(cron) == 1, cron
    fields = cron[0].split(None, 6)
    assert fields[5] == "root"
    command = shlex.split(fields[6].split(">")[0])
    gc = exec_starts()["cartonstore-gc.service"]
    assert command[-len(gc) - 2:] == [*gc, "--config", "/etc/cartonstore/cartonstore.toml"]
    assert "Environment=CARTONSTORE_CONFIG=/etc/cartonstore/cartonstore.toml" in \
        (UNITS / "cartonstore-gc.service").read_text()
