"""A stand-in Hugging Face Hub on 127.0.0.1 for publish tests: answers the calls huggingface_hub makes, records them.

Endpoints (what huggingface_hub 2.x calls for create_repo + upload_folder, plus the look-ups around them):
  GET  /api/whoami-v2                         the token's user
  POST /api/repos/create                      {name, organization, visibility|private, type}; 409 if it exists
  POST /api/validate-yaml                     README metadata check: {"errors": [], "warnings": []}
  GET  /api/models/OWNER/NAME[/revision/REV]  repo info (id, private, sha, cardData) or 404 RepoNotFound
  POST /api/models/OWNER/NAME/preupload/REV   every file "regular" (inline in the commit), none ignored
  POST /api/models/OWNER/NAME/commit/REV      ndjson: header + base64 "file" lines; stores the files
Every call needs `Authorization: Bearer <token>` with a token in `tokens` (401 otherwise, like the Hub), and writes
need the token's user to be the repo owner (403 otherwise). Anything else is answered 404 and recorded.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Request:
    method: str
    path: str
    authorized_as: str | None  # the user of a valid token, None otherwise; the token itself is not kept
    body: bytes
    status: int = 0


@dataclass
class Repo:
    repo_id: str
    private: bool
    files: dict[str, bytes] = field(default_factory=dict)
    commits: list[dict[str, Any]] = field(default_factory=list)
    card_data: dict[str, Any] | None = None

    @property
    def sha(self) -> str:
        return self.commits[-1]["oid"] if self.commits else "0" * 40


class HubStandin:
    """Start with `with HubStandin(tokens={"hf_x": "alice"}) as hub:`; point HF_ENDPOINT at `hub.url`."""

    def __init__(self, tokens: dict[str, str] | None = None) -> None:
        self.tokens = dict(tokens or {})  # token -> user name
        self.repos: dict[str, Repo] = {}
        self.requests: list[Request] = []
        self.lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ----- lifecycle
    def start(self) -> HubStandin:
        hub = self

        class Handler(_Handler):
            standin = hub

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="hub-standin", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> HubStandin:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def url(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    # ----- helpers for tests
    def add_repo(self, repo_id: str, private: bool = False, card_data: dict | None = None) -> Repo:
        with self.lock:
            repo = self.repos[repo_id] = Repo(repo_id, private, card_data=card_data)
            return repo

    def paths(self) -> list[tuple[str, str]]:
        """(method, path without query) of every request, in order."""
        return [(r.method, r.path.split("?")[0]) for r in self.requests]

    def recorded_bytes(self) -> bytes:
        """Every request body the server received, concatenated (for token scans)."""
        return b"\n".join(r.body for r in self.requests)


class _Handler(BaseHTTPRequestHandler):
    standin: HubStandin
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
        pass

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    # ----- plumbing
    def _handle(self, method: str) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        hub = self.standin
        auth = self.headers.get("Authorization", "")
        token = auth[len("Bearer ") :] if auth.startswith("Bearer ") else None
        user = hub.tokens.get(token) if token else None
        record = Request(method, self.path, user, body)
        with hub.lock:
            hub.requests.append(record)
        try:
            status, payload, headers = self._route(method, self.path.split("?")[0], body, token, user)
        except Exception as exc:  # a bug in the stand-in: answer 500 with the reason
            status, payload, headers = 500, {"error": f"stand-in error: {exc!r}"}, {}
        record.status = status
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    def _route(self, method: str, path: str, body: bytes, token: str | None, user: str | None):
        hub = self.standin
        if token is not None and user is None:
            return (
                401,
                {"error": "Invalid credentials in Authorization header"},
                {"X-Error-Message": "Invalid credentials in Authorization header"},
            )
        if method == "POST" and path == "/api/validate-yaml":
            return 200, {"errors": [], "warnings": []}, {}
        if user is None:
            return 401, {"error": "Invalid username or password."}, {}
        if method == "GET" and path == "/api/whoami-v2":
            return 200, {"type": "user", "name": user, "fullname": user, "orgs": [], "auth": {}}, {}
        if method == "POST" and path == "/api/repos/create":
            return self._create(json.loads(body or b"{}"), user)
        m = re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/[^/]+)?", path)
        if method == "GET" and m:
            repo = hub.repos.get(m.group(1))
            if repo is None or (repo.private and repo.repo_id.split("/")[0] != user):
                return 404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"}
            info = {"id": repo.repo_id, "private": repo.private, "sha": repo.sha, "siblings": []}
            info["siblings"] = [{"rfilename": name} for name in sorted(repo.files)]
            if repo.card_data is not None:
                info["cardData"] = repo.card_data
            return 200, info, {}
        m = re.fullmatch(r"/api/models/([^/]+/[^/]+)/(preupload|commit)/([^/]+)", path)
        if method == "POST" and m:
            repo = hub.repos.get(m.group(1))
            if repo is None:
                return 404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"}
            if repo.repo_id.split("/")[0] != user:
                return 403, {"error": "You don't have the rights to write to this repo"}, {}
            if m.group(2) == "preupload":
                files = json.loads(body)["files"]
                modes = [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False} for f in files]
                return 200, {"files": modes, "commitOid": repo.sha}, {}
            return self._commit(repo, body)
        return 404, {"error": f"stand-in: no route for {method} {path}"}, {}

    def _create(self, payload: dict, user: str):
        hub = self.standin
        owner = payload.get("organization") or user
        repo_id = f"{owner}/{payload['name']}"
        if owner != user:
            return 403, {"error": f'You don\'t have the rights to create a model under the namespace "{owner}"'}, {}
        url = f"{hub.url}/{repo_id}"
        with hub.lock:
            if repo_id in hub.repos:
                return 409, {"error": "You already created this model repo", "url": url}, {}
            private = payload.get("visibility") == "private" or bool(payload.get("private"))
            hub.repos[repo_id] = Repo(repo_id, private)
        return 200, {"url": url, "name": repo_id, "id": repo_id}, {}

    def _commit(self, repo: Repo, body: bytes):
        lines = [json.loads(line) for line in body.splitlines() if line.strip()]
        header = next(line["value"] for line in lines if line["key"] == "header")
        added = {}
        for line in lines:
            if line["key"] == "file":
                value = line["value"]
                assert value.get("encoding") == "base64"
                added[value["path"]] = base64.b64decode(value["content"])
            elif line["key"] == "lfsFile":
                return 422, {"error": "stand-in: LFS uploads are not supported (preupload answers regular)"}, {}
            elif line["key"] != "header":
                return 422, {"error": f"stand-in: unsupported commit line {line['key']}"}, {}
        oid = hashlib.sha1(body).hexdigest()
        with self.standin.lock:
            repo.files.update(added)
            repo.commits.append({"oid": oid, "summary": header.get("summary"), "files": sorted(added)})
        url = f"{self.standin.url}/{repo.repo_id}/commit/{oid}"
        return 200, {"commitUrl": url, "commitOid": oid, "success": True}, {}
