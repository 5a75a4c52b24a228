"""A stand-in for the Hugging Face Hub, which is not reachable here: a real
aiohttp server on 127.0.0.1 that answers what huggingface_hub and
cartonstore ask of the Hub, and an ``Origin`` on another port as its CDN.

What it answers, as the Hub does (the fields and headers huggingface_hub
2.x reads):

* ``GET /api/models/{repo}`` and ``/api/models/{repo}/revision/{rev}``: the
  model's ``id``, ``sha`` (the commit the revision names) and ``siblings``
  (``rfilename``; with ``?blobs=true`` also ``size``, ``blobId`` and, for
  LFS files, ``lfs: {sha256, size, pointerSize}``).
* ``GET /api/models/{repo}/tree/{rev}?recursive=true``: every file as
  ``{type, path, size, oid, lfs: {oid, size, pointerSize}}`` (one page).
* ``HEAD``/``GET /{repo}/resolve/{rev}/{path}``: an LFS file is a ``302`` to
  the CDN (another port: another host to a client) with ``X-Repo-Commit``,
  ``X-Linked-Etag`` (its sha256), ``X-Linked-Size`` and ``ETag``; a file kept
  in git is a ``200`` with its bytes (``Range`` honoured), ``ETag`` (its git
  object id) and ``X-Repo-Commit``.
* refusals with the Hub's ``X-Error-Code``: an unknown repository or a
  private one asked without its token ``401 RepoNotFound``, an unknown
  revision ``404 RevisionNotFound``, an unknown file ``404 EntryNotFound``,
  a gated repository's files without an accepted token ``401 GatedRepo``.

Every request is recorded with its Authorization header (``requests``), so a
test sees what went where; the CDN records its own (``cdn.requests``).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path
from urllib.parse import unquote

from aiohttp import web

from kit.origin import Origin, _parse_range

LFS_SUFFIXES = (".safetensors", ".bin", ".gguf", ".onnx", ".pt", ".pth", ".h5", ".msgpack", ".ckpt")
LFS_THRESHOLD = 10 << 20   # the Hub keeps bigger files in LFS whatever their suffix


def git_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass(frozen=True)
class HubFile:
    path: str
    size: int
    git_oid: str
    sha256: str | None   # LFS files only
    data: bytes | None   # git files only (LFS files' bytes are at the CDN)


@dataclass
class Repo:
    commits: dict[str, dict[str, HubFile]] = field(default_factory=dict)
    refs: dict[str, str] = field(default_factory=dict)
    token: str | None = None      # private: only this token reads it
    gated: bool = False           # gated: the listing is public, files need ``token`` (an accepted account)
    hidden: set[str] = field(default_factory=set)   # listed, but resolve answers EntryNotFound
    hidden_after: float = 0.0     # seconds before that refusal


@dataclass(frozen=True)
class Seen:
    method: str
    path: str
    query: str
    authorization: str | None


class HubServer:
    """The Hub stand-in; ``with HubServer() as hub:``. ``hub.endpoint`` is what
    HF_ENDPOINT is set to."""

    def __init__(self) -> None:
        self.cdn = Origin()
        self.repos: dict[str, Repo] = {}
        self.requests: list[Seen] = []
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self.port = 0

    # ---- lifecycle -------------------------------------------------------

    def __enter__(self) -> HubServer:
        self.cdn.start()
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), name="hub-stand-in", daemon=True)
        self._thread.start()
        ready.wait(30)
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(30)
        self.cdn.stop()

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, handle_signals=False, access_log=None)
        self._loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        self._loop.run_until_complete(site.start())
        self.port = self._runner.addresses[0][1]
        ready.set()
        try:
            self._loop.run_forever()
        finally:
            self._loop.run_until_complete(self._runner.cleanup())
            self._loop.close()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # ---- content ---------------------------------------------------------

    def add_repo(self, repo: str, files: dict[str, bytes | Path], *, refs: tuple[str, ...] = ("main",),
                 token: str | None = None, gated: bool = False, lfs: tuple[str, ...] | None = None) -> str:
        """A commit of these files (bytes, or a file served from disk: LFS),
        named by ``refs``; returns its sha. LFS files: those ``lfs`` names,
        else those with a weights suffix, over 10 MiB, or given as a Path."""
        entries = {}
        for path, body in sorted(files.items()):
            in_lfs = path in lfs if lfs is not None else (
                isinstance(body, Path) or path.endswith(LFS_SUFFIXES) or len(body) >= LFS_THRESHOLD)
            entries[path] = self._store(path, body, in_lfs)
        commit = hashlib.sha1(json.dumps([repo, [(e.path, e.git_oid) for e in entries.values()]]).encode()).hexdigest()
        with self._lock:
            entry = self.repos.setdefault(repo, Repo())
            entry.commits[commit] = entries
            entry.refs.update(dict.fromkeys(refs, commit))
            entry.token, entry.gated = token, gated
        return commit

    def _store(self, path: str, body: bytes | Path, in_lfs: bool) -> HubFile:
        if not in_lfs:
            data = body.read_bytes() if isinstance(body, Path) else body
            return HubFile(path, len(data), git_oid(data), None, data)
        sha, size = _sha256_and_size(body)
        if isinstance(body, Path):
            self.cdn.put_file(f"/lfs/{sha}", body, etag=sha)
        else:
            self.cdn.put(f"/lfs/{sha}", body)
        pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha}\nsize {size}\n".encode()
        return HubFile(path, size, git_oid(pointer), sha, None)

    def tamper(self, sha256: str, data: bytes) -> None:
        """The CDN serves other bytes for this LFS object than its sha256 names."""
        self.cdn.put(f"/lfs/{sha256}", data)

    def tamper_git(self, repo: str, path: str, data: bytes) -> None:
        """resolve serves other bytes for this git file than the object id
        the listing gives it (in every commit that holds it)."""
        with self._lock:
            for entries in self.repos[repo].commits.values():
                if path in entries:
                    entries[path] = replace(entries[path], data=data)

    def hide(self, repo: str, path: str, *, after: float = 0.0) -> None:
        """The listing names the file; resolve answers EntryNotFound for it,
        ``after`` seconds late."""
        with self._lock:
            self.repos[repo].hidden.add(path)
            self.repos[repo].hidden_after = after

    def seen(self, *, path_part: str = "") -> list[Seen]:
        with self._lock:
            return [r for r in self.requests if path_part in r.path]

    # ---- serving ---------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raw = request.rel_url.raw_path
        with self._lock:
            self.requests.append(Seen(request.method, unquote(raw), request.query_string,
                                      request.headers.get("Authorization")))
        if raw.startswith("/api/models/"):
            return self._api(request, raw[len("/api/models/"):])
        if "/resolve/" in raw:
            repo, _, rest = raw[1:].partition("/resolve/")
            rev, _, path = rest.partition("/")
            return await self._resolve(request, unquote(repo), unquote(rev), unquote(path))
        return web.Response(status=404)

    def _refusal(self, status: int, code: str, message: str) -> web.Response:
        return web.Response(status=status, headers={"X-Error-Code": code, "X-Error-Message": message},
                            text=json.dumps({"error": message}), content_type="application/json")

    def _find(self, request: web.Request, repo_id: str, rev: str, *, files: bool
              ) -> tuple[Repo, str] | web.Response:
        """The repository and commit asked for, or the Hub's refusal."""
        sent = (request.headers.get("Authorization") or "").removeprefix("Bearer ")
        repo = self.repos.get(repo_id)
        if repo is None or (repo.token is not None and not repo.gated and sent != repo.token):
            return self._refusal(401 if not sent else 404, "RepoNotFound", "Repository not found")
        if repo.gated and files and sent != repo.token:
            return self._refusal(401 if not sent else 403, "GatedRepo",
                                 f"Access to model {repo_id} is restricted. You must have access to it and be "
                                 f"authenticated to access it. Please log in.")
        commit = repo.refs.get(rev, rev if rev in repo.commits else None)
        if commit is None:
            return self._refusal(404, "RevisionNotFound", "Invalid rev id: " + rev)
        return repo, commit

    def _api(self, request: web.Request, rest: str) -> web.StreamResponse:
        repo_id, kind, rev = rest, "info", "main"
        for marker in ("/revision/", "/tree/"):
            if marker in rest:
                repo_id, _, rev = rest.partition(marker)
                kind = marker.strip("/")
        found = self._find(request, unquote(repo_id), unquote(rev), files=False)
        if isinstance(found, web.Response):
            return found
        repo, commit = found
        entries = repo.commits[commit].values()
        if kind == "tree":
            return web.json_response([{"type": "file", "path": e.path, "size": e.size, "oid": e.git_oid,
                                       **({"lfs": {"oid": e.sha256, "size": e.size, "pointerSize": 134}}
                                          if e.sha256 else {})} for e in entries])
        blobs = request.query.get("blobs", "").lower() == "true"
        siblings = [{"rfilename": e.path, **({"size": e.size, "blobId": e.git_oid} if blobs else {}),
                     **({"lfs": {"sha256": e.sha256, "size": e.size, "pointerSize": 134}}
                        if blobs and e.sha256 else {})} for e in entries]
        return web.json_response({"_id": commit[:24], "id": unquote(repo_id), "modelId": unquote(repo_id),
                                  "sha": commit, "private": repo.token is not None and not repo.gated,
                                  "gated": "auto" if repo.gated else False, "disabled": False, "downloads": 0,
                                  "likes": 0, "tags": [], "lastModified": "2026-01-01T00:00:00.000Z",
                                  "createdAt": "2026-01-01T00:00:00.000Z", "siblings": siblings})

    async def _resolve(self, request: web.Request, repo_id: str, rev: str, path: str) -> web.StreamResponse:
        found = self._find(request, repo_id, rev, files=True)
        if isinstance(found, web.Response):
            return found
        repo, commit = found
        entry = repo.commits[commit].get(path)
        if entry is None or path in repo.hidden:
            if path in repo.hidden:
                await asyncio.sleep(repo.hidden_after)
            return self._refusal(404, "EntryNotFound", f"{path} does not exist on \"{rev}\"")
        headers = {"X-Repo-Commit": commit, "ETag": f'"{entry.git_oid}"', "Accept-Ranges": "bytes"}
        if entry.sha256 is not None:
            headers.update({"Location": self.cdn.url(f"/lfs/{entry.sha256}"), "X-Linked-Etag": f'"{entry.sha256}"',
                            "X-Linked-Size": str(entry.size)})
            return web.Response(status=302, headers=headers)
        data = entry.data or b""
        status, start, end = 200, 0, len(data)
        if request.headers.get("Range"):
            parsed = _parse_range(request.headers["Range"], len(data))
            if parsed == "416":
                return web.Response(status=416, headers={"Content-Range": f"bytes */{len(data)}"})
            if isinstance(parsed, tuple):
                status, start, end = 206, parsed[0], parsed[1] + 1
                headers["Content-Range"] = f"bytes {start}-{end - 1}/{len(data)}"
        if request.method == "HEAD":
            headers["Content-Length"] = str(end - start)
            return web.Response(status=status, headers=headers)
        return web.Response(status=status, headers=headers, body=data[start:end])


def _sha256_and_size(body: bytes | Path) -> tuple[str, int]:
    if isinstance(body, bytes):
        return hashlib.sha256(body).hexdigest(), len(body)
    h = hashlib.sha256()
    with open(body, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest(), body.stat().st_size
