#!/usr/bin/env python3
"""Benchmark: a decoupled model's streamed responses over gRPC
ModelStreamInfer, against a bare grpcio server yielding the same messages,
in the same run.

    python tests/bench/bench_stream.py [--responses 1000] [--rounds 5] [--sandbox none]

A python-runner model yields --responses responses of 16 bytes (OUT:
uint8[16], IDX: uint32[1]) to one request; one client (a plain grpcio
stub, on the daemon's Unix gRPC socket) sends the request and reads every
response, --rounds times after one warm-up. The baseline is a bare grpcio
asyncio server on uvloop (the daemon's HTTP/2 settings) in a process of its
own whose ModelStreamInfer yields the same --responses messages at once,
read by the same client over a Unix socket.

Printed: responses/s of each round (median and best), the ratio daemon /
baseline of the medians, and the target (>= 20,000 responses/s).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
sys.path.insert(0, str(HERE.parent))

import grpc
import numpy as np
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

TARGET = 20_000
SIZE = 16

REPEAT = '''
import numpy as np

BLOCK = np.arange(16, dtype=np.uint8)


class Repeat:
    def infer_stream_with_tensors(self, tensors):
        for i in range(int(tensors["IN"][0])):
            yield {"OUT": BLOCK, "IDX": np.array([i], np.uint32)}


def get_model():
    return Repeat()
'''



def _request(count: int) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="repeat", id="bench")
    request.inputs.add(name="IN", datatype="INT32", shape=[1])
    request.raw_input_contents.append(np.array([count], np.int32).tobytes())
    return request


def rates(target: str, count: int, rounds: int) -> list[float]:
    """responses/s of each round (after one warm-up) reading ``count`` responses of one request."""
    out = []
    with grpc.insecure_channel(target) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        for round_ in range(rounds + 1):
            started = time.perf_counter()
            got = 0
            for answer in stub.ModelStreamInfer(iter([_request(count)])):
                assert not answer.error_message, answer.error_message
                got += 1
                if got == count:
                    break
            elapsed = time.perf_counter() - started
            assert got == count, got
            if round_:
                out.append(count / elapsed)
    return out


def floor_server(socket_path: str) -> None:
    """The baseline: ModelStreamInfer yields IN[0] messages like the daemon's, at once."""
    import uvloop

    from cartonstore.server.rpc.grpc_server import TRANSPORT_OPTIONS

    class Floor(pb_grpc.GRPCInferenceServiceServicer):
        async def ModelStreamInfer(self, request_iterator: AsyncIterator[pb.ModelInferRequest],
                                   context: object) -> AsyncIterator[pb.ModelStreamInferResponse]:
            async for request in request_iterator:
                count = int(np.frombuffer(request.raw_input_contents[0], np.int32)[0])
                block = np.arange(SIZE, dtype=np.uint8).tobytes()
                for i in range(count):
                    answer = pb.ModelInferResponse(model_name=request.model_name, model_version="1", id=request.id)
                    answer.parameters["triton_final_response"].bool_param = False
                    answer.outputs.add(name="OUT", datatype="UINT8", shape=[SIZE])
                    answer.outputs.add(name="IDX", datatype="UINT32", shape=[1])
                    answer.raw_output_contents.extend([block, np.array([i], np.uint32).tobytes()])
                    yield pb.ModelStreamInferResponse(infer_response=answer)

    async def serve() -> None:
        server = grpc.aio.server(options=list(TRANSPORT_OPTIONS))
        pb_grpc.add_GRPCInferenceServiceServicer_to_server(Floor(), server)
        server.add_insecure_port(f"unix:{socket_path}")
        await server.start()
        print("ready", flush=True)
        await server.wait_for_termination()

    uvloop.run(serve())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--responses", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sandbox", default="none", help="runners.sandbox for the daemon's runner")
    parser.add_argument("--floor-server", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.floor_server:
        floor_server(args.floor_server)
        return

    from kit.daemonkit import DaemonProcess
    from kit.inferkit import repeat_carton

    from cartonstore.cli.commands import main as cli

    with tempfile.TemporaryDirectory(dir="/tmp", prefix="cs-bs-") as tmp:
        base = Path(tmp)
        src = repeat_carton(base / "src", "repeat", REPEAT, "uint8", SIZE, [1])
        floor_sock = str(base / "floor.sock")
        floor = subprocess.Popen([sys.executable, __file__, "--floor-server", floor_sock], stdout=subprocess.PIPE,
                                 text=True)
        d = DaemonProcess(base / "root", listen=None, env={"CARTONSTORE_SANDBOX": args.sandbox}).start()
        try:
            assert floor.stdout is not None and floor.stdout.readline().strip() == "ready"
            assert cli(["add", str(src), "--name", "repeat", "--root", str(d.root), "--progress", "none"]) == 0
            with grpc.insecure_channel(d.grpc_unix) as channel:
                pb_grpc.GRPCInferenceServiceStub(channel).RepositoryModelLoad(
                    pb.RepositoryModelLoadRequest(model_name="repeat"))
            ours = rates(d.grpc_unix, args.responses, args.rounds)
            bare = rates(f"unix:{floor_sock}", args.responses, args.rounds)
        finally:
            d.stop()
            floor.terminate()
            floor.wait()
    for label, figures in (("daemon (python runner, decoupled)", ours), ("bare grpcio stream (baseline)", bare)):
        print(f"{label:36s} responses/s: median {statistics.median(figures):9,.0f}  best {max(figures):9,.0f}  "
              f"rounds {', '.join(f'{f:,.0f}' for f in figures)}")
    print(f"ratio daemon / baseline (medians): {statistics.median(ours) / statistics.median(bare):.2f}")
    print(f"target: >= {TARGET:,} responses/s over gRPC: {'met' if statistics.median(ours) >= TARGET else 'NOT met'}")


if __name__ == "__main__":
    main()
