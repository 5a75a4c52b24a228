"""[runners.<name>] tables: runner commands in the config file."""

from __future__ import annotations

from pathlib import Path

import pytest
import tomli_w

from cartonstore.config import Config
from cartonstore.config.load import load_config
from cartonstore.errors import InvalidInput


def config_with(tmp_path: Path, text: str) -> Config:
    path = tmp_path / "cartonstore.toml"
    path.write_text(text)
    return load_config(path, env={})


def test_a_runner_table_is_a_command(tmp_path: Path) -> None:
    config = config_with(tmp_path, '[runners]\nmax_inflight = 8\n[runners.mine]\n'
                                   'command = ["{python}", "-m", "mine", "--socket", "{socket}"]\n'
                                   'env = { OMP_NUM_THREADS = "2" }\nframework_version = "1.2.3"\n')
    mine = config.runners.commands["mine"]
    assert mine.command == ("{python}", "-m", "mine", "--socket", "{socket}")
    assert dict(mine.env) == {"OMP_NUM_THREADS": "2"} and mine.framework_version == "1.2.3"
    assert config.runners.max_inflight == 8


def test_runner_tables_survive_print_config(tmp_path: Path) -> None:
    config = config_with(tmp_path, '[runners.mine]\ncommand = ["x", "{model_dir}"]\n')
    again = config_with(tmp_path, tomli_w.dumps(config.as_dict()))
    assert again.runners == config.runners


@pytest.mark.parametrize(("table", "fragment"), [
    ('command = []', "'command' must be a non-empty list of strings"),
    ('command = "serve"', "'command' must be a non-empty list of strings"),
    ('command = ["x", "{nope}"]', "unknown placeholder {nope}"),
    ('command = ["x"]\nenv = { A = 1 }', "'env' must be a table of strings"),
    ('command = ["x"]\nframework_version = ""', "'framework_version' must be a version string"),
    ('command = ["x"]\ncwd = "/"', "unknown key(s) cwd"),
])
def test_bad_runner_tables_are_named(tmp_path: Path, table: str, fragment: str) -> None:
    with pytest.raises(InvalidInput, match="runners") as info:
        config_with(tmp_path, f"[runners.mine]\n{table}\n")
    assert fragment in str(info.value) and "[runners.mine]" in str(info.value)


@pytest.mark.parametrize("text, fragment", [
    ('[runners]\nprewarm = ["onnx"]\n[runners.onnx]\ncommand = ["/opt/onnx/serve", "{socket}"]\n',
     "onnx is run by a [runners.onnx] command here; only the built-in runners can be pre-warmed"),
    ('[runners]\nbuiltin = false\nprewarm = ["python"]\n', "the built-in runners are off"),
    ('[runners]\nprewarm = "onnx"\n', "runners.prewarm"),
])
def test_prewarm_only_names_builtin_runners_that_run(tmp_path: Path, text: str, fragment: str) -> None:
    path = tmp_path / "c.toml"
    path.write_text(text)
    with pytest.raises(InvalidInput) as e:
        load_config(path, env={})
    assert fragment in str(e.value)


def test_the_kinds_that_may_be_pre_warmed_are_the_built_in_runners() -> None:
    from cartonstore.config.runners import PREWARM_KINDS
    from cartonstore.runner.builtin_runners import BUILTIN_RUNNERS

    assert sorted(PREWARM_KINDS) == sorted(BUILTIN_RUNNERS)
