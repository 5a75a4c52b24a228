"""bench_rf.py's KServe contender: KServe's ModelServer with a kserve.Model
that calls onnxruntime in-process, on the v2 REST protocol (binary tensor
data in and out, as tritonclient asks). Run with a python that has kserve:

    python kserve_rf.py MODEL.onnx PORT

Prints "ready" once /v2/health/ready answers. Configured as a user who
wants speed would: one worker, no gRPC, no latency or access logging.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import urllib.request

import onnxruntime as ort
from kserve import InferOutput, InferRequest, InferResponse, Model, ModelServer

_DATATYPES = {"float32": "FP32", "int64": "INT64", "float64": "FP64", "int32": "INT32"}


class Forest(Model):
    def __init__(self, name: str, path: str) -> None:
        super().__init__(name)
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        self.session = ort.InferenceSession(path, sess_options=options, providers=["CPUExecutionProvider"])
        self.names = [o.name for o in self.session.get_outputs()]
        self.ready = True

    def predict(self, payload: InferRequest, headers: dict | None = None,
                response_headers: dict | None = None) -> InferResponse:
        feed = {i.name: i.as_numpy() for i in payload.inputs}
        outputs = []
        for name, value in zip(self.names, self.session.run(self.names, feed), strict=True):
            out = InferOutput(name=name, shape=list(value.shape), datatype=_DATATYPES[value.dtype.name])
            out.set_data_from_numpy(value, binary_data=True)
            outputs.append(out)
        return InferResponse(response_id=payload.id, model_name=self.name, infer_outputs=outputs,
                             use_binary_outputs=True)


def announce_when_ready(port: int) -> None:
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=1) as r:
                if r.status == 200:
                    print("ready", flush=True)
                    return
        except OSError:
            pass
        time.sleep(0.1)


if __name__ == "__main__":
    path, port = sys.argv[1], int(sys.argv[2])
    threading.Thread(target=announce_when_ready, args=(port,), daemon=True).start()
    logging.disable(logging.INFO)
    ModelServer(http_port=port, enable_grpc=False, workers=1, enable_latency_logging=False,
                enable_docs_url=False).start([Forest("rf", path)])
