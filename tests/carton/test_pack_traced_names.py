"""docs/cartons.md's rule for a TorchScript file's examples: each is named
as forward names its parameter, for a traced module as for a scripted one
(a traced torch.nn.Linear's is "input" only because its forward is
forward(self, input)); another name is refused, naming forward's. Needs torch."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from cartonstore.cli.commands import main

torch = pytest.importorskip("torch", reason="torch is not installed in this environment")


class Masked(torch.nn.Module):
    def forward(self, features, mask):  # noqa: ANN201 - traced: torch reads the names, not the types
        return features * mask


@pytest.mark.slow
def test_a_traced_modules_examples_are_named_as_forwards_parameters(tmp_path: Path, capsys) -> None:
    model = tmp_path / "masked.pt"
    torch.jit.trace(Masked(), (torch.ones(2, 3), torch.ones(2, 3))).save(str(model))
    np.save(tmp_path / "f.npy", np.ones((2, 3), np.float32))
    out = tmp_path / "masked.carton"
    examples = ["--example", f"features={tmp_path / 'f.npy'}", "--example", f"mask={tmp_path / 'f.npy'}"]
    assert main(["pack", str(model), *examples, "-o", str(out)]) == 0, capsys.readouterr().err
    capsys.readouterr()
    assert main(["inspect", str(out), "--json"]) == 0
    assert [t["name"] for t in json.loads(capsys.readouterr().out)["inputs"]] == ["features", "mask"]
    out.unlink()
    assert main(["pack", str(model), "--example", f"input={tmp_path / 'f.npy'}", "--example",
                 f"mask={tmp_path / 'f.npy'}", "-o", str(out)]) == 4
    assert "input 'input' is not an argument of forward (its arguments: 'features', 'mask')" in capsys.readouterr().err
    assert not out.exists()
