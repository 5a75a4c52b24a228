"""The mount table's parser (csi/mountinfo.py): lines as the kernel writes
them, escapes, optional fields, and which mounts are a model's directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from cartonstore.csi.mountinfo import mounts_at, parse_mountinfo
from cartonstore.errors import InvalidInput

DIGEST = "ae9cb1b40c740f29fb38a2fa7d88f19c6a30d139c090e61d4b4f1c6700619d61"
TABLE = (
    "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
    f"40 22 8:1 /var/lib/cartonstore/models/{DIGEST} /var/lib/kubelet/pods/p1/volumes/kubernetes.io~csi/m/mount "
    "ro,nosuid,nodev,relatime shared:1 master:2 - ext4 /dev/sda1 rw\n"
    f"41 22 8:2 /models/{DIGEST}//deleted /pods/with\\040space ro,nosuid,nodev - xfs /dev/sdb rw\n"
    "42 22 8:1 /tmp/other /pods/with\\040space rw - ext4 /dev/sda1 rw\n"
    f"43 22 8:1 /x/notmodels/{DIGEST} /elsewhere ro - ext4 /dev/sda1 rw\n"
)


def test_a_bound_model_directory_is_recognised_by_its_root() -> None:
    mounts = parse_mountinfo(TABLE)
    assert [m.model_digest for m in mounts] == [None, DIGEST, DIGEST, None, None]
    kubelet = mounts[1]
    assert kubelet.is_read_only and not kubelet.is_deleted and kubelet.fstype == "ext4"
    assert kubelet.mount_point == "/var/lib/kubelet/pods/p1/volumes/kubernetes.io~csi/m/mount"


def test_escaped_paths_and_stacked_mounts_in_the_order_made() -> None:
    stacked = mounts_at(parse_mountinfo(TABLE), "/pods/with space")
    assert [m.mount_id for m in stacked] == [41, 42]
    assert stacked[0].is_deleted and not stacked[1].is_read_only


def test_this_process_table_parses() -> None:
    assert any(m.mount_point == "/" for m in parse_mountinfo(Path("/proc/self/mountinfo").read_text()))


@pytest.mark.parametrize("line", ["", "22 1 8:1 / / rw", "x 1 8:1 / / rw - ext4 /dev/sda1 rw", "1 2 3 4 5 6 -"])
def test_a_line_not_in_the_kernel_format_is_named(line: str) -> None:
    with pytest.raises(InvalidInput, match="mountinfo line 2"):
        parse_mountinfo(TABLE.splitlines()[0] + "\n" + (line or "junk"))
