"""Where a runner writes an output requested in shared memory
(cartonstore.runner.shm.MappedRegions.sink): into the mapping for a
region of the daemon's own uid, through pwrite for another uid's, whose
truncation must never SIGBUS a runner every uid shares."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from cartonstore.errors import InvalidInput
from cartonstore.runner.shm import FdSink, MappedRegions
from cartonstore.v2.shared_memory import RegionShrunk, ShmRef

SIZE = 1 << 20


@pytest.fixture
def region_of() -> Iterator[Callable[..., tuple[MappedRegions, Path]]]:
    made: list[tuple[MappedRegions, Path]] = []

    def make(foreign: bool, offset: int = 0) -> tuple[MappedRegions, Path]:
        key = f"/cs-test-{os.getpid()}-sink{len(made)}"
        path = Path("/dev/shm" + key)
        path.write_bytes(b"\0" * (offset + SIZE))
        regions = MappedRegions()
        regions.register("out", {"key": key, "offset": offset, "byte_size": SIZE,
                                 "cartonstore_copy_inputs": foreign})
        made.append((regions, path))
        return made[-1]

    yield make
    for regions, path in made:
        regions.close()
        path.unlink(missing_ok=True)


@pytest.mark.parametrize("foreign", [False, True])
@pytest.mark.parametrize("offset", [0, 4096 + 100])
def test_an_output_lands_where_the_reference_says(region_of, foreign: bool, offset: int) -> None:
    regions, path = region_of(foreign, offset)
    data = np.arange(1000, dtype=np.float32)
    sink = regions.sink(ShmRef("out", 512, data.nbytes), "requested output 'y'")
    try:
        assert isinstance(sink, FdSink) == foreign   # the daemon's own uid: straight into the mapping
        assert sink.capacity == data.nbytes and sink.offset is None
        sink.write(memoryview(data).cast("B"))   # as encode._write_to_shm hands it
    finally:
        sink.close()
    stored = path.read_bytes()
    assert stored[offset + 512:offset + 512 + data.nbytes] == data.tobytes()
    assert stored.count(0) == len(stored) - data.nbytes + data.tobytes().count(0)   # nothing else written


def test_a_region_truncated_before_its_output_is_written_is_refused(region_of) -> None:
    """The size is checked as the sink is made, after the model ran: a
    400, not a SIGBUS in the runner."""
    regions, path = region_of(False)
    os.truncate(path, 4096)
    with pytest.raises(InvalidInput, match="cannot be used"):
        regions.sink(ShmRef("out", 0, 8192), "requested output 'y'")


def test_a_region_truncated_after_its_sink_was_made_is_refused_at_the_copy(region_of) -> None:
    """Outputs encoded before this one may take a while: the size is looked
    at again right before the copy, which would otherwise be SIGBUS here."""
    regions, path = region_of(False)
    sink = regions.sink(ShmRef("out", 0, 8192), "requested output 'y'")
    try:
        os.truncate(path, 4096)
        with pytest.raises(RegionShrunk, match="requested output 'y'.*cannot be used"):
            sink.write(b"x" * 8192)
    finally:
        sink.close()
    assert path.stat().st_size == 4096   # nothing written past the end


@pytest.mark.parametrize("mode,others", [(0o600, False), (0o640, False), (0o660, True), (0o606, True)])
def test_an_object_of_the_daemons_uid_others_may_write_is_treated_as_theirs(tmp_path: Path, mode: int,
                                                                            others: bool) -> None:
    from cartonstore.server.tensors.shm_regions import _others_can_truncate

    path = tmp_path / "object"
    path.write_bytes(b"\0" * 64)
    path.chmod(mode)
    assert _others_can_truncate(path.stat()) is others


@pytest.mark.parametrize("foreign", [False, True])
def test_a_float_output_is_measured_in_bytes_not_items(region_of, foreign: bool) -> None:
    """1,000 float32 fit a 1,000-byte reference by items, not by bytes:
    a 400 naming both sizes, nothing written (FdSink wrote past the region)."""
    from cartonstore.v2.encode import _write_to_shm
    from cartonstore.v2.shared_memory import RegionTooSmall

    regions, path = region_of(foreign)
    data = np.arange(1, 1001, dtype=np.float32)
    sink = regions.sink(ShmRef("out", 0, 1000), "requested output 'y'")
    try:
        with pytest.raises(RegionTooSmall, match="gives it 1000 bytes, but it needs 4000 bytes"):
            _write_to_shm("requested output 'y'", memoryview(data), sink)
        fits = regions.sink(ShmRef("out", 0, data.nbytes), "requested output 'y'")
        try:
            assert _write_to_shm("requested output 'y'", memoryview(data), fits)["shared_memory_byte_size"] == 4000
        finally:
            fits.close()
    finally:
        sink.close()
    assert path.read_bytes()[:4000] == data.tobytes()
