"""Lay a carton out as a read-only directory tree under models/<digest>/.

Plan, then apply (as dvc-data does): ``plan_tree`` is a pure function of the
carton's entries; ``build_tree`` makes the tree in tmp/ with hardlinks to the
blobs (copying only where a hardlink is impossible), makes it read-only and
renames it into place, so a model directory appears whole or not at all.
"""

from __future__ import annotations

import errno
import os
import posixpath
import shutil
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from cartonstore.errors import NotFound, Unavailable
from cartonstore.format.entry import EntryRow
from cartonstore.store.content.blobs import fsync_dir
from cartonstore.store.root.owner import tmp_name

DIR_MODE = 0o555


@dataclass(frozen=True)
class TreePlan:
    dirs: tuple[str, ...]                 # parents first
    files: tuple[tuple[str, str], ...]    # (path, blob digest)
    symlinks: tuple[tuple[str, str], ...]  # (path, relative target)


def plan_tree(entries: Iterable[EntryRow], manifest_digest: str) -> TreePlan:
    """What the directory must contain: every MANIFEST entry plus MANIFEST itself."""
    files = [("MANIFEST", manifest_digest)]
    links = []
    dirs: set[str] = set()
    for e in entries:
        parent = posixpath.dirname(e.path)
        while parent:
            dirs.add(parent)
            parent = posixpath.dirname(parent)
        if e.kind == "symlink":
            links.append((e.path, e.target or ""))
        else:
            files.append((e.path, e.digest))
    return TreePlan(tuple(sorted(dirs, key=lambda d: (d.count("/"), d))), tuple(files), tuple(links))


def link_or_copy(src: Path, dst: Path) -> str:
    """Hardlink src to dst; copy when the filesystem refuses (other device,
    link-count limit, no hardlink support). Returns "hardlink" or "copy"."""
    try:
        os.link(src, dst)
        return "hardlink"
    except OSError as e:
        if e.errno not in (errno.EXDEV, errno.EMLINK, errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP):
            raise
    shutil.copyfile(src, dst)
    os.chmod(dst, 0o444)
    return "copy"


def build_tree(plan: TreePlan, blob_path: Callable[[str], Path], tmp_dir: Path, dest: Path,
               *, link: Callable[[Path, Path], str] = link_or_copy) -> bool:
    """Build the tree in tmp/ and rename it to ``dest``. Returns False when
    another process won the race and ``dest`` already exists (a normal outcome).
    A full disk raises Unavailable with nothing left behind."""
    work = tmp_name(tmp_dir, "model")
    try:
        work.mkdir()
        _populate(plan, blob_path, work, link)
        _make_read_only(work, plan)
        fsync_dir(work)
        try:
            # Moving a directory to another parent rewrites its "..": the kernel asks for write permission on
            # it, which a root daemon without CAP_DAC_OVERRIDE (the systemd unit's) has only before the chmod.
            os.rename(work, dest)
        except OSError as e:
            if e.errno in (errno.EEXIST, errno.ENOTEMPTY):
                remove_tree(work)
                return False
            raise
        os.chmod(dest, DIR_MODE)
        fsync_dir(dest.parent)
        return True
    except OSError as e:
        remove_tree(work)
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise Unavailable(f"no space left on device materializing {dest.name} (in {tmp_dir})",
                              subject=str(dest)) from e
        raise
    except BaseException:
        remove_tree(work)
        raise


def _populate(plan: TreePlan, blob_path: Callable[[str], Path], work: Path,
              link: Callable[[Path, Path], str]) -> None:
    for d in plan.dirs:
        (work / d).mkdir()
    for path, digest in plan.files:
        try:
            link(blob_path(digest), work / path)
        except FileNotFoundError:
            raise NotFound(f"blob {digest} for {path} is not in the store", subject=digest) from None
    for path, target in plan.symlinks:
        os.symlink(target, work / path)


def _make_read_only(work: Path, plan: TreePlan) -> None:
    """Every directory below the top read-only (the top once it is in place: build_tree)."""
    for d in reversed(plan.dirs):
        os.chmod(work / d, DIR_MODE)


def link_tree(src: Path, dst: Path) -> None:
    """Lay a materialized model directory out again in the empty directory
    ``dst`` by hardlinks (copies where the filesystem refuses one, as
    link_or_copy does): the same files, read-only like the original.
    OSError when neither works."""
    made: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(src):   # a symlinked directory is listed, not followed
        here = dst / os.path.relpath(dirpath, src)
        for name in (*dirnames, *filenames):
            source = Path(dirpath, name)
            if source.is_symlink():
                os.symlink(os.readlink(source), here / name)
            elif name in dirnames:
                (here / name).mkdir()
                made.append(here / name)
            else:
                link_or_copy(source, here / name)
    for directory in reversed(made):   # deepest first: a read-only parent would refuse its children's chmod
        os.chmod(directory, DIR_MODE)


def remove_tree(path: Path) -> None:
    """Delete a (read-only) tree: directories get write permission back first."""
    if not os.path.lexists(path):
        return

    def onerror(func: Callable[..., object], p: str, exc_info: object) -> None:
        parent = os.path.dirname(p)
        try:
            os.chmod(parent, 0o755)
            if os.path.isdir(p) and not os.path.islink(p):
                os.chmod(p, 0o755)
            func(p)
        except FileNotFoundError:
            pass

    for dirpath, _dirnames, _ in os.walk(path):
        try:
            os.chmod(dirpath, 0o755)
        except OSError:
            pass
    shutil.rmtree(path, onerror=onerror)


def check_tree(plan: TreePlan, root: Path, blob_path: Callable[[str], Path],
               rehash: Callable[[Path], str], corrupt: frozenset[str] = frozenset()) -> list[str]:
    """Problems of a materialized tree against its plan (empty when sound).
    A file that shares a sound blob's inode is as good as the blob; anything
    else (a copy, or a link to a blob known corrupt) is rehashed."""
    problems: list[str] = []
    expected = {p for p, _ in plan.files} | {p for p, _ in plan.symlinks} | set(plan.dirs)
    for path, digest in plan.files:
        p = root / path
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            problems.append(f"{path}: missing")
            continue
        if not stat.S_ISREG(st.st_mode):
            problems.append(f"{path}: not a regular file")
            continue
        try:
            b = os.stat(blob_path(digest))
            if digest not in corrupt and (b.st_ino, b.st_dev) == (st.st_ino, st.st_dev):
                continue
        except FileNotFoundError:
            pass
        actual = rehash(p)
        if actual != digest:
            problems.append(f"{path}: sha256 {actual}, MANIFEST says {digest}")
    for path, target in plan.symlinks:
        p = root / path
        if not p.is_symlink() or os.readlink(p) != target:
            problems.append(f"{path}: symlink to {target!r} missing or changed")
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        for n in dirnames + filenames:
            r = n if rel == "." else f"{rel}/{n}"
            if r not in expected:
                problems.append(f"{r}: not in MANIFEST")
    return problems

