"""A local stand-in for the Hugging Face Hub (the real one cannot be reached from here): the model API and file
downloads that huggingface_hub uses, with the Hub's headers, gated-repository errors and their real texts, HTTP
ranges for resumed downloads, and an optional speed limit so progress can be watched.

Texts of the gated errors, as the Hub sends them: 401 "Access to model X is restricted. You must have access to it and
be authenticated to access it. Please log in." (vllm-project/semantic-router#817) and 403 "Access to model X is
restricted and you are not in the authorized list. Visit https://huggingface.co/X to ask for access."
(IBM/unitxt#837).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

API = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)(?:/revision/(?P<rev>[^/?]+))?$")
TREE = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/tree/(?P<rev>[^/?]+)$")
RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)$")


@dataclass
class Repo:
    files: dict[str, bytes]
    gated: bool = False
    readers: set[str] = field(default_factory=set)  # tokens that accepted the licence
    commit: str = ""

    def __post_init__(self) -> None:
        digest = hashlib.sha1(b"".join(sorted(self.files.values())))
        self.commit = self.commit or digest.hexdigest()

    @classmethod
    def from_folder(cls, folder: Path, **kwargs: Any) -> Repo:
        return cls({str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()},
                   **kwargs)


@dataclass
class Hub:
    repos: dict[str, Repo] = field(default_factory=dict)
    bytes_per_s: float | None = None  # slow the file bodies down, to see progress
    requests: list[tuple[str, str, str]] = field(default_factory=list)  # method, path, Range header
    url: str = ""


def _handler(hub: Hub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            return None

        def _send(self, status: int, body: bytes, headers: dict[str, str]) -> None:
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command == "HEAD":
                return
            step = 64 * 1024 if hub.bytes_per_s else len(body) or 1
            for start in range(0, len(body), step):
                self.wfile.write(body[start:start + step])
                self.wfile.flush()
                if hub.bytes_per_s:
                    time.sleep(step / hub.bytes_per_s)

        def _error(self, status: int, code: str, message: str) -> None:
            body = json.dumps({"error": message}).encode()
            self._send(status, body, {"Content-Type": "application/json", "X-Error-Code": code,
                                      "X-Error-Message": message})

        def _allowed(self, repo_id: str, repo: Repo) -> bool:
            if not repo.gated:
                return True
            auth = self.headers.get("Authorization", "")
            token = auth.removeprefix("Bearer ").strip()
            if not token:
                self._error(401, "GatedRepo", f"Access to model {repo_id} is restricted. You must have access to it "
                                              "and be authenticated to access it. Please log in.")
                return False
            if token not in repo.readers:
                self._error(403, "GatedRepo", f"Access to model {repo_id} is restricted and you are not in the "
                                              f"authorized list. Visit https://huggingface.co/{repo_id} to ask for "
                                              "access.")
                return False
            return True

        def _repo(self, repo_id: str) -> Repo | None:
            repo = hub.repos.get(repo_id)
            if repo is None:
                self._error(401, "RepoNotFound", "Repository not found")
            return repo

        def do_HEAD(self) -> None:
            self.do_GET()

        def do_GET(self) -> None:
            path = unquote(urlparse(self.path).path)
            hub.requests.append((self.command, path, self.headers.get("Range", "")))
            if m := TREE.match(path):
                repo = self._repo(m["repo"])
                if repo is None:
                    return
                tree = [{"type": "file", "path": name, "size": len(data), "oid": hashlib.sha1(data).hexdigest()}
                        for name, data in repo.files.items()]
                self._send(200, json.dumps(tree).encode(), {"Content-Type": "application/json"})
                return
            if m := API.match(path):
                repo = self._repo(m["repo"])
                if repo is None:
                    return
                info = {"_id": repo.commit[:24], "id": m["repo"], "modelId": m["repo"], "sha": repo.commit,
                        "private": False, "disabled": False, "gated": "manual" if repo.gated else False,
                        "tags": [], "siblings": [{"rfilename": name, "size": len(data),
                                                  "blobId": hashlib.sha1(data).hexdigest()}
                                                 for name, data in repo.files.items()]}
                self._send(200, json.dumps(info).encode(), {"Content-Type": "application/json"})
                return
            if m := RESOLVE.match(path):
                repo = self._repo(m["repo"])
                if repo is None or not self._allowed(m["repo"], repo):
                    return
                data = repo.files.get(m["path"])
                if data is None:
                    self._error(404, "EntryNotFound", "Entry not found")
                    return
                headers = {"X-Repo-Commit": repo.commit, "ETag": f'"{hashlib.sha256(data).hexdigest()}"',
                           "Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"}
                start = 0
                if ranged := re.match(r"bytes=(\d+)-", self.headers.get("Range", "")):
                    start = int(ranged[1])
                    headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
                    self._send(206, data[start:], headers)
                    return
                self._send(200, data, headers)
                return
            self._error(404, "NotFound", "Not found")

    return Handler


@contextmanager
def serve(hub: Hub) -> Iterator[Hub]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(hub))
    server.daemon_threads = True
    hub.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield hub
    finally:
        server.shutdown()
        server.server_close()
