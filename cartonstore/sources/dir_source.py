"""CartonView over an unpacked carton directory (or a directory to pack).

Symlinks follow Carton's packer: a link whose target stays inside the same
top-level folder is kept as a link; one pointing elsewhere is read through
and stored as the file it points to. A confined view (a directory named by
an API caller) refuses a link that leaves the directory, naming it, and opens
no path that resolves outside it. Every look at the directory (the listing,
metadata, each open) runs with ``rights``: a caller's own, for a directory a
caller named to a daemon running as root (system/callers.py).
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import BinaryIO

from cartonstore.errors import InvalidCarton, NotFound
from cartonstore.format.paths import validate_carton_path
from cartonstore.system.callers import OWN_RIGHTS, OwnRights

from .view import SourceFile

_METADATA = ("MANIFEST", "LINKS")


class DirCartonView:
    def __init__(self, root: Path, *, confined: bool = False, rights: OwnRights = OWN_RIGHTS) -> None:
        self.label = str(root)
        self.confined = confined
        self.rights = rights
        self.files: dict[str, SourceFile] = {}
        rights.run(self._list, root)

    def _list(self, root: Path) -> None:
        if not root.is_dir():   # a directory the reader may not look into raises PermissionError, naming it
            raise NotFound(f"no such directory: {root}", subject=str(root))
        self.root = root.resolve()
        for dirpath, dirnames, filenames in os.walk(self.root, onerror=_raise):
            dirnames.sort()
            for name in sorted(filenames) + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
                full = os.path.join(dirpath, name)
                rel = os.path.relpath(full, self.root).replace(os.sep, "/")
                if rel in _METADATA:
                    continue
                validate_carton_path(rel)
                self.files[rel] = self._source_file(rel, full)

    def _source_file(self, rel: str, full: str) -> SourceFile:
        st = os.lstat(full)
        if stat.S_ISLNK(st.st_mode) and self.confined and not self._inside(full):
            raise InvalidCarton(rel, f"is a symlink out of the carton (to {os.readlink(full)!r}): a carton given to "
                                     "the daemon may not name files outside its directory")
        if stat.S_ISLNK(st.st_mode):
            kept = self._kept_link_target(rel, full)
            if kept is not None:
                return SourceFile(rel, "symlink", None, kept)
            try:
                st = os.stat(full)
            except FileNotFoundError:
                raise InvalidCarton(rel, f"is a broken symlink (to {os.readlink(full)!r})") from None
        if stat.S_ISDIR(st.st_mode):
            raise InvalidCarton(rel, "is a symlink to a directory; only files can be linked")
        if not stat.S_ISREG(st.st_mode):
            raise InvalidCarton(rel, "is not a regular file (device, socket or fifo)")
        return SourceFile(rel, "file", st.st_size)

    def _kept_link_target(self, rel: str, full: str) -> str | None:
        """The link's relative target if it stays inside rel's top-level folder."""
        target = os.readlink(full)
        top = self.root / rel.split("/", 1)[0]
        resolved = Path(os.path.normpath(os.path.join(os.path.dirname(full), target)))
        if os.path.isabs(target) or top not in resolved.parents:
            return None
        return target

    def read_metadata(self, name: str) -> bytes | None:
        return self.rights.run(self._read_metadata, name)

    def _read_metadata(self, name: str) -> bytes | None:
        from .view import METADATA_LIMITS

        p = self.root / name
        if self.confined and p.is_symlink():   # it would be read, and its first line echoed in an error
            raise InvalidCarton(name, f"is a symlink (to {os.readlink(p)!r}): a carton given to the daemon may "
                                      "not name files outside its directory")
        if not p.is_file():
            return None
        if p.stat().st_size > METADATA_LIMITS[name]:
            raise InvalidCarton(name, f"is more than the {METADATA_LIMITS[name]} bytes allowed")
        if self.confined:
            with self.open(name) as f:
                return f.read(METADATA_LIMITS[name] + 1)
        return p.read_bytes()

    def _inside(self, full: str) -> bool:
        return Path(os.path.realpath(full)).is_relative_to(self.root)

    def open(self, path: str) -> BinaryIO:
        return self.rights.run(self._open, path)

    def _open(self, path: str) -> BinaryIO:
        if self.confined:
            return os.fdopen(self._open_beneath(path), "rb")
        return open(self.root / path, "rb")

    def _open_beneath(self, path: str) -> int:
        """Open path component by component from the root, following no
        symlink: one swapped in since the listing (a file, or a directory
        above it) fails the read instead of leading out of the carton. A
        link the listing kept inside its folder is read where it points,
        checked the same way."""
        full = self.root / path
        if os.path.islink(full):
            target = os.path.realpath(full)
            if not Path(target).is_relative_to(self.root):
                raise InvalidCarton(path, "resolves outside the carton's directory")
            path = os.path.relpath(target, self.root)
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            *dirs, last = path.split("/")
            for part in dirs:
                nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
                os.close(fd)
                fd = nxt
            # O_NONBLOCK: a fifo swapped in since the listing must not hang the read on its open
            leaf = os.open(last, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=fd)
            if not stat.S_ISREG(os.fstat(leaf).st_mode):
                os.close(leaf)
                raise InvalidCarton(path, "changed while it was read: no longer a regular file")
            return leaf
        except PermissionError:   # named in full: the reader saw the name in the listing
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(self.root / path)) from None
        except OSError as e:
            raise InvalidCarton(path, f"changed while it was read ({e.strerror}): a symlink where the listing "
                                      "saw none") from None
        finally:
            os.close(fd)

    def close(self) -> None:
        pass


def _raise(error: OSError) -> None:
    """os.walk's onerror: a folder that cannot be listed fails the view
    (skipped, it would make a carton without its files)."""
    raise error
