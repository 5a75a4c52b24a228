#!/usr/bin/env python3
"""Benchmark: getting a big input onto the GPU, pinned staging against
pageable copies, in the same run (needs torch with a CUDA device).

    python tests/bench/bench_gpu_staging.py [--mib 256] [--repeats 10] [--no-runner]

1. Host to device, in this process, of a --mib float32 numpy array (the
   form a runner holds an input in). Baseline: ``torch.from_numpy(a).to(
   "cuda")``, a pageable copy, what a runner without staging does. Ours:
   the torchscript runner's TensorStaging (runner/backends/torch_staging.py): one
   memcpy into a reused page-locked buffer, then an asynchronous copy.
   Floor: the asynchronous copy alone from a pinned tensor already filled
   (no host copy: the bus's speed). Each is synchronized and timed, the
   median of --repeats after two warm-ups, in GiB/s.
2. The same input through a real torchscript runner process on cuda:0
   (a model that returns its input's sum), ``pinned_staging`` true against
   false, median wall time of --repeats requests: what staging is worth
   end to end, the Unix-socket transfer and decoding included.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
sys.path.insert(0, str(HERE.parent))

MODEL = '''
import torch

class Total(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.sum().reshape(1)
'''


def _median_seconds(fn, repeats: int) -> float:
    for _ in range(2):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def in_process(torch, array: np.ndarray, repeats: int) -> None:
    from cartonstore.runner.backends.torch_staging import TensorStaging

    gib = array.nbytes / (1 << 30)
    staging = TensorStaging(torch, "cuda:0", pinned=True)
    filled = torch.from_numpy(array).pin_memory()

    def pageable() -> None:
        torch.from_numpy(array).to("cuda:0")
        torch.cuda.synchronize()

    def staged() -> None:
        staging.to_device(array, "x")
        torch.cuda.synchronize()

    def floor() -> None:
        filled.to("cuda:0", non_blocking=True)
        torch.cuda.synchronize()

    base = _median_seconds(pageable, repeats)
    ours = _median_seconds(staged, repeats)
    dma = _median_seconds(floor, repeats)
    print(f"1. host to device, {array.nbytes >> 20} MiB float32, median of {repeats}:")
    print(f"   pageable (baseline)  {base * 1e3:8.1f} ms  {gib / base:6.1f} GiB/s")
    print(f"   pinned staging       {ours * 1e3:8.1f} ms  {gib / ours:6.1f} GiB/s   {base / ours:5.2f}x the baseline's speed")
    print(f"   pinned DMA alone     {dma * 1e3:8.1f} ms  {gib / dma:6.1f} GiB/s   (the floor)")


def through_a_runner(torch, array: np.ndarray, repeats: int) -> None:
    from kit.runnerkit import carton_toml, runner_infer, save_scripted, start_runner, stop_runner, wait_ready

    with tempfile.TemporaryDirectory(prefix="cs-gpu-") as tmp:
        root = Path(tmp) / "total"
        save_scripted(MODEL, "Total", root / "model" / "model.pt")
        (root / "carton.toml").write_text(carton_toml("torchscript", ">=2.0", None, model_name="total"))
        results = {}
        for pinned in (False, True):
            sock = Path(tmp) / f"r{int(pinned)}.sock"
            proc = start_runner("torchscript", root, sock, devices="cuda:0", opts={"pinned_staging": pinned})
            try:
                wait_ready(sock, proc=proc, timeout=120)

                def one() -> None:
                    status, answer = runner_infer(sock, {"x": array})  # noqa: B023 - timed within this round
                    assert status == 200, answer
                results[pinned] = _median_seconds(one, repeats)
            finally:
                stop_runner(proc)
    print(f"2. one {array.nbytes >> 20} MiB infer through a torchscript runner on cuda:0, median of {repeats}:")
    print(f"   pinned_staging = false (baseline)  {results[False] * 1e3:8.1f} ms")
    print(f"   pinned_staging = true              {results[True] * 1e3:8.1f} ms   "
          f"{results[False] / results[True]:5.2f}x the baseline's speed")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--no-runner", action="store_true", help="only part 1")
    args = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        sys.exit("bench_gpu_staging: no CUDA device (torch.cuda.is_available() is False)")
    print(f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    array = np.random.default_rng(0).standard_normal((args.mib << 20) // 4, dtype=np.float32)
    in_process(torch, array, args.repeats)
    if not args.no_runner:
        through_a_runner(torch, array, args.repeats)


if __name__ == "__main__":
    main()
