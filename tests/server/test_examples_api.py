"""A loaded carton's tensor_data, examples and misc files, served by a real
daemon from the real carton Carton's own tools made (tests/fixtures),
read with the cartonstore client and tritonclient's response parser."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tomli_w
import tritonclient.http as triton
from conftest import short_dir
from kit.daemonkit import DaemonProcess, unix_session

from cartonstore.client.infer import InferClient
from cartonstore.errors import NotFound
from cartonstore.format.media_types import media_type

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "carton-repo-test.carton"
STRINGS = ["Hello 💖 😂😍🎉👍 Unicode", "Some Telugu: గ ఘ ఙ చ ఛ జ ఝ ఞ ట ఠ డ ఢ ణ త థ ద ధ న ప ఫ బ భ మ య ర ఱ",
           "Let's 🤑 make 🙋😬 sure 👍 emojis ⚽ work 💼🙄 well 🤓🤒"]


def nested_carton(dest: Path) -> Path:
    (dest / "tensor_data").mkdir(parents=True)
    (dest / "carton.toml").write_text(tomli_w.dumps({
        "spec_version": 1, "model_name": "nested",
        "runner": {"runner_name": "no_such_runner", "required_framework_version": ">=1"}}))
    (dest / "tensor_data" / "index.toml").write_text(tomli_w.dumps({"tensor": [
        {"name": "a", "dtype": "int8", "shape": [2], "file": "a.bin"},
        {"name": "pair", "dtype": "nested", "inner": ["a"]}]}))
    (dest / "tensor_data" / "a.bin").write_bytes(b"\x01\x02")
    return dest


@pytest.fixture(scope="module")
def served() -> Iterator[DaemonProcess]:
    """The fixture loaded as files only (no built-in runners): its python
    runner and its (broken) self-test are not what is tested here."""
    with short_dir() as base:
        config = base / "c.toml"
        config.write_text("[runners]\nbuiltin = false\n")
        d = DaemonProcess(base / "root", listen=None, extra_args=["--config", str(config)]).start()
        try:
            for name, source in (("fx", FIXTURE), ("nested", nested_carton(base / "nested"))):
                status, body, _ = get(d, f"/v2/repository/models/{name}/load", method="POST",
                                      data=json.dumps({"parameters": {"source": str(source)}}).encode())
                assert status == 200, body
            yield d
        finally:
            d.stop()


def get(d: DaemonProcess, path: str, headers: dict | None = None, method: str = "GET",
        data: bytes | None = None) -> tuple[int, bytes, dict]:
    async def go() -> tuple[int, bytes, dict]:
        async with unix_session(d.socket_path) as s:
            r = await s.request(method, path, headers=headers, data=data)
            return r.status, await r.read(), dict(r.headers)
    status, body, headers_ = asyncio.run(go())
    return status, body, headers_


def test_a_tensor_comes_framed_like_an_infer_output(served: DaemonProcess) -> None:
    status, body, headers = get(served, "/v2/models/fx/tensors/_tensor_1")
    assert status == 200 and headers["Content-Type"] == "application/octet-stream"
    length = int(headers["Inference-Header-Content-Length"])
    header = json.loads(body[:length])
    assert header["outputs"] == [{"name": "_tensor_1", "datatype": "FP32", "shape": [5],
                                  "parameters": {"binary_data_size": 20}}]
    result = triton.InferResult.from_response_body(body, header_length=length)
    values = result.as_numpy("_tensor_1")
    assert values.dtype == np.float32 and values.shape == (5,)
    with InferClient(served.socket_path) as c:
        assert np.array_equal(c.tensor("fx", "_tensor_1"), values)
        strings = c.tensor("fx", "_tensor_0")
        assert [s.decode() for s in strings] == STRINGS
        assert c.tensor("fx", "_tensor_2").dtype == np.uint32
        assert c.tensor("fx", "_tensor_3").shape == ()


def test_a_tensor_as_json_when_asked(served: DaemonProcess) -> None:
    for path, headers in (("/v2/models/fx/tensors/_tensor_0", {"Accept": "application/json"}),
                          ("/v2/models/fx/tensors/_tensor_0?format=json", None)):
        status, body, answer_headers = get(served, path, headers)
        assert status == 200 and "Inference-Header-Content-Length" not in answer_headers
        (out,) = json.loads(body)["outputs"]
        assert out["datatype"] == "BYTES" and out["data"] == STRINGS


def test_tensor_errors_name_the_problem(served: DaemonProcess) -> None:
    status, body, _ = get(served, "/v2/models/fx/tensors/nope")
    assert status == 404 and "no tensor 'nope' in tensor_data/ (tensors: '_tensor_1', '_tensor_0'" in \
        json.loads(body)["error"]
    status, body, _ = get(served, "/v2/models/nested/tensors/pair")
    assert status == 400 and "tensor 'pair' is nested" in json.loads(body)["error"] and "inner tensors: a" in \
        json.loads(body)["error"]
    status, body, _ = get(served, "/v2/models/ghost/tensors/a")
    assert status == 404 and "model 'ghost' is not loaded" in json.loads(body)["error"]
    status, body, _ = get(served, "/v2/models/fx/versions/0000/tensors/_tensor_1")
    assert status == 404 and "Request for unknown model: 'fx' version 0000 is not found" in json.loads(body)["error"]
    with InferClient(served.socket_path) as c, pytest.raises(NotFound, match="no tensor 'nope'"):
        c.tensor("fx", "nope")


def test_examples_link_their_tensors_and_typed_misc_files(served: DaemonProcess) -> None:
    with InferClient(served.socket_path) as c:
        (example,) = c.examples("fx")
        assert c.examples("nested") == []
    assert example["name"] == "an_optional_name"
    assert example["inputs"]["f"] == {"file": "misc/_example_misc_file_0", "content_type": "image/png",
                                      "url": "/v2/models/fx/misc/_example_misc_file_0"}
    assert example["sample_out"]["y"] == {"tensor": "_tensor_3", "url": "/v2/models/fx/tensors/_tensor_3"}
    status, body, headers = get(served, example["inputs"]["f"]["url"])
    assert status == 200 and headers["Content-Type"] == "image/png" and body.startswith(b"\x89PNG")
    assert len(body) == 539819
    status, _, headers = get(served, "/v2/models/fx/misc/model_architecture.png")
    assert status == 200 and headers["Content-Type"] == "image/png"
    assert get(served, example["sample_out"]["y"]["url"])[0] == 200


@pytest.mark.parametrize(("path", "status", "fragment"), [
    ("/v2/models/fx/misc/..%2Fcarton.toml", 400, "is not a file path a carton can hold"),
    ("/v2/models/fx/misc/a%5Cb.png", 400, "is not a file path a carton can hold"),
    ("/v2/models/fx/misc/missing.png", 404, "this carton has no file misc/missing.png"),
])
def test_misc_paths_outside_misc_or_absent_are_refused(served: DaemonProcess, path: str, status: int,
                                                       fragment: str) -> None:
    got, body, _ = get(served, path)
    assert got == status and fragment in json.loads(body)["error"], body


@pytest.mark.parametrize(("name", "head", "expected"), [
    ("a.png", b"", "image/png"), ("a.JPG", b"", "image/jpeg"), ("song.mp3", b"", "audio/mpeg"),
    ("clip.mp4", b"", "video/mp4"), ("x", b"\x89PNG\r\n\x1a\n....", "image/png"), ("x", b"\xff\xd8\xff\xe0", "image/jpeg"),
    ("x", b"ID3\x04", "audio/mpeg"), ("x", b"\0\0\0\x18ftypmp42", "video/mp4"), ("x", b"plain", "application/octet-stream"),
    ("dir.v2/file", b"\x89PNG\r\n\x1a\n", "image/png"),
])
def test_media_types(name: str, head: bytes, expected: str) -> None:
    assert media_type(name, head) == expected
