"""Triton's response cache in the daemon, through a real daemon, real
python runners and stock tritonclient (HTTP and gRPC): the model counts
its own calls and answers the count, so a hit shows as an answer whose
count did not move. The same request hits whatever door it came through
first, with the new request's id; another input misses; [cache] size bounds
what is kept, least recently used first out; shared memory and failed
answers are never cached; a reload or unload drops a model's answers;
statistics and /metrics count hits and misses as Triton names them; the
config's refusals name what is wrong; with no cache the model loads with a
warning. The LRU and the key are also checked on their own."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as triton
import tritonclient.utils.shared_memory as shm
from conftest import short_dir
from kit.daemonkit import DaemonProcess, call
from kit.runnerkit import carton_toml
from tritonclient.utils import InferenceServerException

from cartonstore.server.models.response_cache import (
    ENTRY_OVERHEAD,
    CachedAnswer,
    CachedOutput,
    ResponseCache,
    request_key,
)
from cartonstore.v2.framing import parse_infer_request
from cartonstore.v2.wire_types import InferRequest, RequestedOutput, WireTensor

COUNTER = '''
import numpy as np

class Counter:
    calls = 0

    def infer_with_tensors(self, tensors):
        self.calls += 1
        x = tensors["x"]
        if (x < 0).any():
            raise ValueError("a negative input, on purpose")
        return {"y": x * 2, "calls": np.array([self.calls], dtype=np.int64)}

def get_model():
    return Counter()
'''
N = 256                                   # elements of x in the size-bound test
ENTRY = ENTRY_OVERHEAD + 4 * N + 8        # what one of its answers takes in the cache: y, calls, overhead
CACHE_SIZE = 3 * ENTRY + 100              # three such answers fit, not four
CACHED = {"response_cache": {"enable": True}}


def _carton(dest: Path, label: str = "v1") -> Path:
    (dest / "model").mkdir(parents=True, exist_ok=True)
    (dest / "model" / "main.py").write_text(COUNTER + f"\nLABEL = {label!r}\n")
    (dest / "carton.toml").write_text(carton_toml(
        "python", ">=3.8", {"entrypoint_package": "main", "entrypoint_fn": "get_model"}, model_name=dest.name,
        inputs=[("x", "float32", ["n"])], outputs=[("y", "float32", ["n"]), ("calls", "int64", [1])]))
    return dest


@pytest.fixture(scope="module")
def cached() -> Iterator[tuple[DaemonProcess, Path]]:
    """A daemon with a response cache of three answers of N elements, on HTTP and gRPC."""
    with short_dir() as base:
        config = base / "cartonstore.toml"
        config.write_text(f"[cache]\nsize = {CACHE_SIZE}\n[server]\nshared_memory_over_tcp = true\n")
        d = DaemonProcess(base / "root", extra_args=["--config", str(config), "--grpc-listen", "127.0.0.1:0"]).start()
        try:
            yield d, base
        finally:
            d.stop()


def _load(d: DaemonProcess, name: str, src: Path, config: dict | None = CACHED) -> tuple[int, object]:
    params = {"source": str(src)}
    if config is not None:
        params["config"] = json.dumps(config)
    return call(d, "POST", f"/v2/repository/models/{name}/load", json={"parameters": params})


def _loaded(d: DaemonProcess, base: Path, name: str, config: dict | None = CACHED) -> None:
    status, body = _load(d, name, _carton(base / name), config)
    assert status == 200, body


def _http(d: DaemonProcess, name: str, x: np.ndarray, *, binary: bool, request_id: str = "") -> tuple[np.ndarray, int, dict]:
    c = triton.InferenceServerClient(d.host_port)
    try:
        tensor = triton.InferInput("x", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x, binary_data=binary)
        outputs = [triton.InferRequestedOutput(n, binary_data=binary) for n in ("y", "calls")]
        result = c.infer(name, [tensor], outputs=outputs, request_id=request_id)
        return result.as_numpy("y"), int(result.as_numpy("calls")[0]), result.get_response()
    finally:
        c.close()


def _grpc(d: DaemonProcess, name: str, x: np.ndarray, request_id: str = "") -> tuple[np.ndarray, int, str]:
    c = tg.InferenceServerClient(d.grpc_host_port)
    try:
        tensor = tg.InferInput("x", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        outputs = [tg.InferRequestedOutput(n) for n in ("y", "calls")]
        result = c.infer(name, [tensor], outputs=outputs, request_id=request_id)
        return result.as_numpy("y"), int(result.as_numpy("calls")[0]), result.get_response().id
    finally:
        c.close()


def _calls(d: DaemonProcess, name: str, x: np.ndarray) -> int:
    return _http(d, name, x, binary=True)[1]


def _cache_stats(d: DaemonProcess, name: str) -> dict:
    status, body = call(d, "GET", f"/v2/models/{name}/stats")
    assert status == 200, body
    assert isinstance(body, dict)
    return body["model_stats"][0]


def _metric(d: DaemonProcess, series: str, name: str | None = None) -> float:
    status, text = call(d, "GET", "/metrics")
    assert status == 200 and isinstance(text, str)
    labels = r"\{[^}]*\}" if name is None else rf'\{{model="{name}",version="[0-9a-f]+"\}}'
    found = re.search(rf"^{series}(?:{labels})? (\S+)$", text, re.MULTILINE)
    assert found, series
    return float(found.group(1))


def test_a_request_hits_through_any_door_and_another_input_misses(cached: tuple[DaemonProcess, Path]) -> None:
    d, base = cached
    _loaded(d, base, "doors")
    try:
        x = np.arange(4, dtype=np.float32)
        y, calls, doc = _http(d, "doors", x, binary=False, request_id="first")
        assert calls == 1 and doc["id"] == "first"
        np.testing.assert_array_equal(y, x * 2)
        # the same request over gRPC: answered from the cache, with its own id
        y, calls, rid = _grpc(d, "doors", x, request_id="second")
        assert (calls, rid) == (1, "second")
        np.testing.assert_array_equal(y, x * 2)
        # over HTTP again, binary this time, then JSON without an id: both hits, each framed as asked
        y, calls, doc = _http(d, "doors", x, binary=True, request_id="third")
        assert calls == 1 and doc["id"] == "third"
        assert all("binary_data_size" in out["parameters"] for out in doc["outputs"])
        y, calls, doc = _http(d, "doors", x, binary=False)
        assert calls == 1 and "id" not in doc and doc["outputs"][0]["data"] == (x * 2).tolist()
        # another input: the runner runs
        assert _grpc(d, "doors", x + 1)[1] == 2
        assert _grpc(d, "doors", x + 1)[1] == 2
        stats = _cache_stats(d, "doors")
        s = stats["inference_stats"]
        assert (s["cache_hit"]["count"], s["cache_miss"]["count"], s["success"]["count"]) == (4, 2, 6)
        assert s["cache_hit"]["ns"] > 0 and s["cache_miss"]["ns"] > 0
        # a hit runs no model: no inference, execution or compute phase counts it (as Triton counts)
        assert (stats["inference_count"], stats["execution_count"], s["compute_infer"]["count"]) == (2, 2, 2)
        assert _metric(d, "nv_cache_num_hits_per_model", "doors") == 4
        assert _metric(d, "nv_cache_num_misses_per_model", "doors") == 2
        assert _metric(d, "nv_cache_hit_duration_per_model", "doors") >= 0
        assert _metric(d, "cartonstore_response_cache_entries") == 2
    finally:
        call(d, "POST", "/v2/repository/models/doors/unload")


def test_the_size_bound_lets_the_least_recently_used_go(cached: tuple[DaemonProcess, Path]) -> None:
    d, base = cached
    _loaded(d, base, "lru")
    try:
        a, b, c, e = (np.full(N, v, np.float32) for v in (1, 2, 3, 4))
        assert [_calls(d, "lru", x) for x in (a, b, c)] == [1, 2, 3]   # three misses: all three kept
        assert _calls(d, "lru", a) == 1        # a hit: a is now the most recently used
        assert _calls(d, "lru", e) == 4        # a fourth answer: b, the least recently used, goes
        assert _metric(d, "cartonstore_response_cache_bytes") == 3 * ENTRY
        assert _calls(d, "lru", c) == 3 and _calls(d, "lru", a) == 1   # kept
        assert _calls(d, "lru", b) == 5        # let go: the runner ran again (and e went)
        assert _calls(d, "lru", e) == 6
        assert _metric(d, "cartonstore_response_cache_evictions_total") >= 3
        # an answer bigger than the whole cache is not kept, and evicts nothing
        big = np.ones(CACHE_SIZE // 4, np.float32)
        assert [_calls(d, "lru", big) for _ in range(2)] == [7, 8]
        assert _calls(d, "lru", e) == 6
    finally:
        call(d, "POST", "/v2/repository/models/lru/unload")


def test_shared_memory_and_failed_answers_are_never_cached(cached: tuple[DaemonProcess, Path]) -> None:
    d, base = cached
    _loaded(d, base, "bypass")
    c = triton.InferenceServerClient(d.host_port)
    key = f"/cs-cache-{os.getpid()}"
    region = shm.create_shared_memory_region("cache-in", key, 64)
    out_region = shm.create_shared_memory_region("cache-out", key + "-out", 64)
    try:
        x = np.arange(4, dtype=np.float32)
        shm.set_shared_memory_region(region, [x])
        c.register_system_shared_memory("cache-in", key, 64)
        counts = []
        for _ in range(2):   # the same request naming the same region: the runner reads it each time
            tensor = triton.InferInput("x", [4], "FP32")
            tensor.set_shared_memory("cache-in", x.nbytes)
            result = c.infer("bypass", [tensor], outputs=[triton.InferRequestedOutput("calls")])
            counts.append(int(result.as_numpy("calls")[0]))
        assert counts == [1, 2]
        c.register_system_shared_memory("cache-out", key + "-out", 64)
        for expected in (3, 4):   # an output to be written into shared memory: the runner runs each time
            tensor = triton.InferInput("x", [4], "FP32")
            tensor.set_data_from_numpy(x + 10)
            wanted = triton.InferRequestedOutput("calls")
            wanted.set_shared_memory("cache-out", 8)
            c.infer("bypass", [tensor], outputs=[wanted])
            assert int(shm.get_contents_as_numpy(out_region, np.int64, [1])[0]) == expected
        for _ in range(2):   # a failed answer is not kept: the model runs again
            with pytest.raises(InferenceServerException, match="negative input"):
                _calls(d, "bypass", -x)
        assert _calls(d, "bypass", x) == 7   # the same bytes sent inline: a miss, nothing cached from shm
        s = _cache_stats(d, "bypass")["inference_stats"]
        assert (s["cache_hit"]["count"], s["cache_miss"]["count"]) == (0, 1)   # shm requests are not looked up
    finally:
        c.unregister_system_shared_memory()
        shm.destroy_shared_memory_region(region)
        shm.destroy_shared_memory_region(out_region)
        c.close()
        call(d, "POST", "/v2/repository/models/bypass/unload")


def test_a_reload_or_unload_drops_the_models_answers(cached: tuple[DaemonProcess, Path]) -> None:
    d, base = cached
    _loaded(d, base, "again")
    x = np.arange(3, dtype=np.float32)
    assert [_calls(d, "again", x) for _ in range(2)] == [1, 1]
    assert _metric(d, "cartonstore_response_cache_entries") == 1
    # a new version: its runner answers, the old version's answer is gone
    status, body = _load(d, "again", _carton(base / "again", label="v2"), CACHED)
    assert status == 200, body
    assert _metric(d, "cartonstore_response_cache_entries") == 0
    assert [_calls(d, "again", x) for _ in range(2)] == [1, 1]
    # the same version loaded without the cache: nothing kept, nothing looked up
    status, body = _load(d, "again", base / "again", None)
    assert status == 200, body
    assert _metric(d, "cartonstore_response_cache_entries") == 0
    assert [_calls(d, "again", x) for _ in range(2)] == [1, 2]
    _loaded(d, base, "again")
    _calls(d, "again", x)
    assert _metric(d, "cartonstore_response_cache_entries") == 1
    assert call(d, "POST", "/v2/repository/models/again/unload")[0] == 200
    assert _metric(d, "cartonstore_response_cache_entries") == 0


def test_the_config_is_read_back_and_its_refusals_name_the_field(cached: tuple[DaemonProcess, Path]) -> None:
    d, base = cached
    src = _carton(base / "conf")
    for config, words in (
            ({"response_cache": {"enable": True, "size": 3}}, "size"),   # protobuf's words: no such field
            ({"response_cache": {"enable": True}, "model_transaction_policy": {"decoupled": True}},
             "response cache does not support a model with the 'decoupled' transaction policy"),):
        status, body = _load(d, "conf", src, config)
        assert status == 400 and isinstance(body, dict) and words in body["error"], (config, body)
    status, body = _load(d, "conf", src, {**CACHED, "model_transaction_policy": {"decoupled": False}})
    assert status == 200, body
    try:
        c = triton.InferenceServerClient(d.host_port)
        assert c.get_model_config("conf")["response_cache"] == {"enable": True}
        c.close()
    finally:
        call(d, "POST", "/v2/repository/models/conf/unload")


def test_a_model_asking_for_the_cache_without_one_loads_with_a_warning(short_tmp: Path) -> None:
    d = DaemonProcess(short_tmp / "root").start()
    try:
        status, body = _load(d, "nocache", _carton(short_tmp / "nocache"))
        assert status == 200, body
        x = np.ones(2, np.float32)
        assert [_calls(d, "nocache", x) for _ in range(2)] == [1, 2]
        s = _cache_stats(d, "nocache")["inference_stats"]
        assert (s["cache_hit"]["count"], s["cache_miss"]["count"]) == (0, 0)
    finally:
        log = d.stop_and_read()
    assert "enables response_cache, but [cache] size is 0" in log


# -- the cache and its key on their own ---------------------------------------------------------------

def _answer(model: str, nbytes: int) -> CachedAnswer:
    return CachedAnswer(model, {}, (CachedOutput("y", "UINT8", (nbytes,), {}, bytes(nbytes)),))


def test_the_lru_keeps_within_its_bytes_and_drops_by_model() -> None:
    cache = ResponseCache(3 * (ENTRY_OVERHEAD + 100))
    for key in (b"a", b"b", b"c"):
        assert cache.put(key, _answer("m", 100))
    assert cache.get(b"a") is not None
    assert cache.put(b"d", _answer("n", 100))
    assert cache.get(b"b") is None and len(cache) == 3 and cache.used == 3 * (ENTRY_OVERHEAD + 100)
    assert not cache.put(b"big", _answer("m", cache.capacity)) and len(cache) == 3
    cache.drop("m")
    assert len(cache) == 1 and cache.get(b"d") is not None and cache.used == ENTRY_OVERHEAD + 100


def _request(body: dict, data: bytes = b"") -> InferRequest:
    header = json.dumps(body).encode()
    return parse_infer_request(header + data, len(header) if data else None)


def test_the_key_is_what_reaches_the_model_not_how_it_travels() -> None:
    x = np.arange(3, dtype=np.float32)
    as_json = _request({"id": "1", "inputs": [{"name": "x", "datatype": "FP32", "shape": [3], "data": x.tolist()}],
                        "outputs": [{"name": "y", "parameters": {"binary_data": False}}]})
    as_binary = _request({"id": "2", "parameters": {"binary_data_output": True},
                          "inputs": [{"name": "x", "datatype": "FP32", "shape": [3],
                                      "parameters": {"binary_data_size": 12}}],
                          "outputs": [{"name": "y", "parameters": {"binary_data": True}}]}, x.tobytes())
    from cartonstore.v2.validate import validate_request
    for req in (as_json, as_binary):
        validate_request(req, None, None)
    key = request_key("m", "d1", as_json)
    assert request_key("m", "d1", as_binary) == key
    assert request_key("m", "d2", as_binary) != key and request_key("n", "d1", as_binary) != key
    other = InferRequest(None, [WireTensor("x", "FP32", [3], {}, memoryview((x + 1).tobytes()))],
                         [RequestedOutput("y", None, {})], {}, True)
    assert request_key("m", "d1", other) != key
    with_param = InferRequest(None, [WireTensor("x", "FP32", [3], {}, memoryview(x.tobytes()))],
                              [RequestedOutput("y", None, {})], {"sequence_id": 5}, True)
    assert request_key("m", "d1", with_param) != key
    same = InferRequest(None, [WireTensor("x", "FP32", [3], {}, memoryview(x.tobytes()))],
                        [RequestedOutput("y", None, {})], {}, True)
    assert request_key("m", "d1", same) == key
