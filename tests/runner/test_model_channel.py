"""The channel that hands a started runner its model (runner/model_channel.py):
a real socket pair and real descriptors, both ends of the framing."""

from __future__ import annotations

import asyncio
import os
import socket
import struct
import threading
from collections.abc import Iterator

import pytest

from cartonstore.runner.model_channel import ChannelError, ModelMessage, receive_model, send_model
from cartonstore.runner.protocol import MODEL_CHANNEL_MAX_MESSAGE


@pytest.fixture()
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    yield ours, theirs
    ours.close()
    theirs.close()


def test_the_arguments_and_a_descriptor_arrive(pair, tmp_path) -> None:
    ours, theirs = pair
    path = tmp_path / "arena"
    path.write_bytes(b"arena bytes")
    fd = os.open(path, os.O_RDONLY)
    try:
        asyncio.run(send_model(ours, ModelMessage(["--model-dir", "/slot", "--name", "m"], {"arena": fd})))
    finally:
        os.close(fd)   # the receiver holds its own copy
    got = receive_model(theirs)
    assert got is not None and got.argv == ["--model-dir", "/slot", "--name", "m"]
    assert list(got.fds) == ["arena"]
    try:
        assert os.pread(got.fds["arena"], 100, 0) == b"arena bytes"
    finally:
        os.close(got.fds["arena"])


def test_no_arguments_means_the_runners_own(pair) -> None:
    ours, theirs = pair
    asyncio.run(send_model(ours, ModelMessage()))
    assert receive_model(theirs) == ModelMessage(None, {})


def test_a_closed_channel_means_not_wanted(pair) -> None:
    ours, theirs = pair
    ours.close()
    assert receive_model(theirs) is None


def test_a_message_in_pieces_is_read_whole(pair) -> None:
    ours, theirs = pair
    payload = b'{"argv": ["' + b"x" * 300_000 + b'"], "fds": []}'

    def write() -> None:
        ours.sendall(struct.pack(">I", len(payload))[:2])
        ours.sendall(struct.pack(">I", len(payload))[2:])
        for i in range(0, len(payload), 4096):
            ours.sendall(payload[i:i + 4096])
    writer = threading.Thread(target=write)
    writer.start()
    got = receive_model(theirs)
    writer.join()
    assert got is not None and got.argv == ["x" * 300_000]


@pytest.mark.parametrize("raw, problem", [
    (struct.pack(">I", MODEL_CHANNEL_MAX_MESSAGE + 1), "at most"),
    (struct.pack(">I", 5) + b"nope!", "not JSON"),
    (struct.pack(">I", 2) + b"[]", "not a model message"),
    (struct.pack(">I", 13) + b'{"argv": [1]}', "not a model message"),
    (struct.pack(">I", 25) + b'{"argv": null, "fds": [1]}'[:25], "not"),
    (struct.pack(">I", 27) + b'{"argv": null, "fds": [[]]}', "not a model message"),
    (struct.pack(">I", 100) + b'{"argv"', "closed 7 bytes into a 100-byte message"),
])
def test_a_malformed_message_is_refused_by_name(pair, raw: bytes, problem: str) -> None:
    ours, theirs = pair
    ours.sendall(raw)
    ours.close()
    with pytest.raises(ChannelError, match=problem):
        receive_model(theirs)


def test_passed_descriptors_of_a_refused_message_are_closed(pair, tmp_path) -> None:
    ours, theirs = pair
    fd = os.open(tmp_path, os.O_RDONLY)
    import array
    ours.sendmsg([struct.pack(">I", 2)], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))])
    ours.sendall(b"{}")
    os.close(fd)
    before = set(os.listdir("/proc/self/fd"))
    with pytest.raises(ChannelError, match="not a model message"):
        receive_model(theirs)
    assert set(os.listdir("/proc/self/fd")) <= before


def test_arguments_too_big_are_refused_before_sending(pair) -> None:
    ours, _theirs = pair
    with pytest.raises(ChannelError, match="at most"):
        asyncio.run(send_model(ours, ModelMessage(["x" * (MODEL_CHANNEL_MAX_MESSAGE + 1)])))


def test_a_big_message_to_a_runner_still_warming_up_does_not_hold_the_loop(pair) -> None:
    """A message past the socket's buffer waits for the runner to read it
    (only once it has warmed up): the daemon's event loop goes on meanwhile."""
    ours, theirs = pair
    argv = ["y" * (MODEL_CHANNEL_MAX_MESSAGE - 100)]
    got: list = []
    reader = threading.Timer(0.5, lambda: got.append(receive_model(theirs)))

    async def send_while_ticking() -> int:
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1
        ticker = asyncio.create_task(tick())
        await send_model(ours, ModelMessage(argv))
        ticker.cancel()
        return ticks

    reader.start()
    ticks = asyncio.run(send_while_ticking())
    reader.join()
    assert ticks >= 20   # the loop ran during the half second the runner did not read
    assert got[0] is not None and got[0].argv == argv
