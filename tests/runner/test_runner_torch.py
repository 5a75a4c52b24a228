"""The torchscript runner's device path, as real runner processes: BF16
crossing exactly (on the CPU, and on a GPU where there is one), a model
placed on cuda:N running there through pinned staging buffers (and
pageable copies with pinned_staging = false), big inputs of changing sizes
reusing them, and a load on cuda:N failing, naming why, where CUDA cannot
be used: never a silent fall back to the CPU. The onnx runner's refusal
too. No tritonclient here (requests are framed by cartonstore.v2), so this
file also runs on a GPU machine that has torch and little else."""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from conftest import short_dir
from kit.runnerkit import (
    assert_stopped_cleanly,
    carton_toml,
    onnx_model_dir,
    runner_infer,
    save_scripted,
    start_runner,
    stop_runner,
    wait_ready,
)

from cartonstore.runner.protocol import EXIT_LOAD_FAILED

torch = pytest.importorskip("torch", reason="torch is not installed in this environment")
HAVE_CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not HAVE_CUDA, reason="no CUDA device here (torch.cuda.is_available() is False)")

MODEL = '''
import torch
from typing import Dict

class Model(torch.nn.Module):
    def forward(self, x: torch.Tensor, h: torch.Tensor) -> Dict[str, torch.Tensor]:
        on_gpu = torch.tensor([1 if x.is_cuda else 0], dtype=torch.int32)
        return {"y": x * 2 + 1, "h2": h * 2, "h": h, "on_gpu": on_gpu, "total": x.sum().reshape(1)}
'''


@pytest.fixture(scope="module")
def base() -> Iterator[Path]:
    with short_dir() as path:
        yield path


@pytest.fixture(scope="module")
def model_dir(base: Path) -> Path:
    """x (float32 [n]) and h (bfloat16 [k]) in; y = 2x + 1, h2 = 2h, h, where it ran, sum(x) out."""
    root = base / "dev"
    save_scripted(MODEL, "Model", root / "model" / "model.pt")
    # no [[input]]/[[output]]: carton format v1 has no bfloat16 dtype to declare
    (root / "carton.toml").write_text(carton_toml("torchscript", ">=2.0", None, model_name="dev"))
    return root


def _bf16(values: list[float]) -> np.ndarray:
    import ml_dtypes

    return np.array(values, dtype=ml_dtypes.bfloat16)


def _serving(model_dir: Path, sock: Path, device: str, **opts: object) -> subprocess.Popen[bytes]:
    proc = start_runner("torchscript", model_dir, sock, devices=device, opts={"num_threads": 2, **opts})
    wait_ready(sock, proc=proc, timeout=120)
    return proc


@pytest.mark.slow
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda:0", marks=needs_cuda)])
def test_bf16_crosses_exactly_both_ways(model_dir: Path, base: Path, device: str) -> None:
    sock = base / f"bf-{device[-1]}.sock"
    proc = _serving(model_dir, sock, device)
    try:
        # values no float32 round trip would keep as bit patterns: a NaN payload, -0.0, subnormals, extremes
        bits = np.array([0x7FC1, 0x8000, 0x0001, 0x7F7F, 0xFF7F, 0x3F81, 0x0080, 0xC2F7], dtype=np.uint16)
        h = bits.view(_bf16([0]).dtype)
        status, (doc, out) = runner_infer(sock, {"x": np.ones(3, np.float32), "h": h})
        assert status == 200, doc
        types = {o["name"]: o["datatype"] for o in doc["outputs"]}
        assert types["h"] == "BF16" and types["h2"] == "BF16"
        assert out["h"].view(np.uint16).tolist() == bits.tolist()
        finite = np.isfinite(h.astype(np.float32)) & (np.abs(h.astype(np.float32)) < 1e38)
        np.testing.assert_array_equal(out["h2"].astype(np.float32)[finite], h.astype(np.float32)[finite] * 2)
        assert out["on_gpu"].tolist() == [int(device != "cpu")]
    finally:
        assert_stopped_cleanly(proc)


@needs_cuda
@pytest.mark.parametrize("pinned", [True, False], ids=["pinned", "pageable"])
def test_a_model_on_a_gpu_runs_there_for_inputs_of_every_size(model_dir: Path, base: Path, pinned: bool) -> None:
    sock = base / f"gpu-{int(pinned)}.sock"
    proc = _serving(model_dir, sock, "cuda:0", pinned_staging=pinned)
    rng = np.random.default_rng(1)
    try:
        # growing, shrinking and growing again: staging buffers are reused and regrown, never stale
        for n in (4, 16 << 20, 1000, 0, (3 << 20) + 5, 24 << 20, 7):
            x = rng.standard_normal(n, dtype=np.float32)
            status, (doc, out) = runner_infer(sock, {"x": x, "h": _bf16([1.5])})
            assert status == 200, doc
            assert out["on_gpu"].tolist() == [1]
            np.testing.assert_array_equal(out["y"], x * 2 + 1)
    finally:
        assert_stopped_cleanly(proc)


@pytest.mark.slow
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda:0", marks=needs_cuda)])
def test_concurrent_calls_each_get_their_own_answer(model_dir: Path, base: Path, device: str) -> None:
    """max_concurrency 4: four connections' threads run the model at once,
    each input of the same name through its own staging buffer (on a GPU,
    from the per-name free list), and no answer is another caller's."""
    sock = base / f"many-{device[-1]}.sock"
    proc = _serving(model_dir, sock, device, max_concurrency=4)
    wrong: list[str] = []

    def caller(index: int) -> None:
        rng = np.random.default_rng(index)
        for round_ in range(12):
            x = rng.standard_normal(1000 + 997 * index + (round_ % 3) * (2 << 20), dtype=np.float32)
            status, (doc, out) = runner_infer(sock, {"x": x, "h": _bf16([float(index)])})
            if status != 200 or not np.array_equal(out["y"], x * 2 + 1):
                wrong.append(f"caller {index} round {round_}: {status} {doc if status != 200 else 'other values'}")

    try:
        callers = [threading.Thread(target=caller, args=(i,)) for i in range(4)]
        for t in callers:
            t.start()
        for t in callers:
            t.join(120)
        assert wrong == []
    finally:
        assert_stopped_cleanly(proc)


@pytest.mark.slow
@pytest.mark.skipif(HAVE_CUDA, reason="CUDA is usable here (the refusal is tested with CUDA_VISIBLE_DEVICES='')")
def test_cuda_placement_without_cuda_fails_the_torchscript_load(model_dir: Path, base: Path) -> None:
    rc, err = stop_runner(start_runner("torchscript", model_dir, base / "nocuda.sock", devices="cuda:0"),
                          sig=0, timeout=60)
    assert rc == EXIT_LOAD_FAILED
    last = err.strip().splitlines()[-1]
    assert "the model is placed on cuda:0, but " in last
    assert "this torch is built without CUDA" in last or "finds no usable GPU" in last


@needs_cuda
def test_cuda_placement_with_no_visible_gpu_fails_the_torchscript_load(model_dir: Path, base: Path) -> None:
    rc, err = stop_runner(start_runner("torchscript", model_dir, base / "hidden.sock", devices="cuda:0",
                                       env={"CUDA_VISIBLE_DEVICES": ""}), sig=0, timeout=60)
    assert rc == EXIT_LOAD_FAILED
    assert "the model is placed on cuda:0, but torch (CUDA" in err and "finds no usable GPU" in err


def test_cuda_placement_without_a_cuda_provider_fails_the_onnx_load(base: Path) -> None:
    ort = pytest.importorskip("onnxruntime")
    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime has a CUDA provider")
    model = onnx_model_dir(base, name="onnx-gpu", ids=False)
    rc, err = stop_runner(start_runner("onnx", model, base / "onnxgpu.sock", devices="cuda:0"), sig=0, timeout=60)
    assert rc == EXIT_LOAD_FAILED
    assert "the model is placed on cuda:0, but this onnxruntime" in err and "has no CUDAExecutionProvider" in err


HALF = '''
import torch

class Half(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(torch.bfloat16)
'''


@pytest.mark.slow
def test_a_bfloat16_output_declared_float32_comes_back_float32(base: Path) -> None:
    """Carton format v1 has no bfloat16: a model computing in it declares
    float32, and its outputs are widened to what carton.toml says."""
    root = base / "half"
    save_scripted(HALF, "Half", root / "model" / "model.pt")
    (root / "carton.toml").write_text(carton_toml("torchscript", ">=2.0", None, model_name="half",
                                                  inputs=[("x", "float32", ["n"])], outputs=[("y", "float32", ["n"])]))
    sock = base / "half.sock"
    proc = _serving(root, sock, "cpu")
    try:
        x = np.array([1.0, 1.00390625, 3.14159], np.float32)
        status, (doc, out) = runner_infer(sock, {"x": x})
        assert status == 200, doc
        assert doc["outputs"][0]["datatype"] == "FP32"
        np.testing.assert_array_equal(out["y"], x.astype(_bf16([0]).dtype).astype(np.float32))
    finally:
        assert_stopped_cleanly(proc)
