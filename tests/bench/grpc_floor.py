#!/usr/bin/env python3
"""The floor of gRPC in Python for bench_infer.py section 8: a bare
grpcio asyncio server on uvloop (the daemon's loop, the daemon's HTTP/2
settings) whose ModelInfer answers its input as y_float32 at once: no
model, no runner, no check. What grpcio itself costs per call.

    python tests/bench/grpc_floor.py   # prints its port, serves until killed
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import grpc
import uvloop
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from cartonstore.server.rpc.grpc_server import TRANSPORT_OPTIONS


class Echo(pb_grpc.GRPCInferenceServiceServicer):
    async def ModelInfer(self, request: pb.ModelInferRequest, context: object) -> pb.ModelInferResponse:
        answer = pb.ModelInferResponse(model_name=request.model_name, id=request.id)
        tensor = request.inputs[0]
        answer.outputs.add(name="y_float32", datatype=tensor.datatype, shape=tensor.shape)
        answer.raw_output_contents.extend(request.raw_input_contents)
        return answer


async def serve() -> None:
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", 64 << 20),
                                      ("grpc.max_send_message_length", -1), *TRANSPORT_OPTIONS])
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(Echo(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(port, flush=True)
    await server.wait_for_termination()


if __name__ == "__main__":
    uvloop.run(serve())
