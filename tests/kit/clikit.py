"""The CLI run in-process through its main, as a user types it, and the
store its tests start from."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import FIXTURE_CARTON

from cartonstore.cli.commands import main
from cartonstore.store import Store


def run(capsys, *argv: str) -> tuple[int, str, str]:  # pytest's CaptureFixture
    """(exit status, stdout, stderr) of ``cartonstore ARGV``."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A store holding the fixture carton, named tiny."""
    with Store(tmp_path / "root") as s:
        s.add(FIXTURE_CARTON, name="tiny")
    return tmp_path / "root"
