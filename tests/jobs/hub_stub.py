"""The Hugging Face Hub's HTTP endpoints that `harbor jobs launch` reaches through huggingface_hub 2.x,
served on 127.0.0.1, so the real client code runs end to end (the Hub itself is not reachable here).

Each route answers as huggingface_hub reads it (the client's files are the reference):
- `GET /api/whoami-v2` (hf_api.py `_inner_whoami`): `{"name", "type", ...}`;
- `POST /api/repos/create` (`create_repo`): `{"url"}`, or 409 for a repo that exists (`exist_ok` takes it);
- `POST /api/models/{repo}/preupload/{revision}` (_commit_api.py `_fetch_upload_modes`): one
  `{"path", "uploadMode", "shouldIgnore"}` per file; binary content is "lfs", as the Hub decides from the
  sample (a wheel is a zip);
- `POST /{repo}.git/info/lfs/objects/batch` (lfs.py `post_lfs_batch_info`, Git LFS batch API): a "basic"
  upload action per object; the client then PUTs the bytes to its `href`. The client takes this path
  rather than Xet's when `HF_HUB_DISABLE_XET` is set (huggingface_hub's own switch), which the tests do:
  the Xet protocol is not imitated;
- `POST /api/models/{repo}/commit/{revision}` (`_send_commit`, NDJSON of `header`, `file`, `lfsFile`):
  `{"commitUrl", "commitOid"}`;
- `HEAD|GET /{repo}/resolve/{revision}/{path}` (file_download.py `get_hf_file_metadata`, `hf_hub_download`):
  the file at that commit, with `X-Repo-Commit`, `ETag` (the LFS sha256) and `Content-Length`;
- `POST /api/jobs/{namespace}` (`run_job`): the job, as `JobInfo(**json)` reads it.

Tokens are checked as the Hub does: `Authorization: Bearer <token>`, else 401.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

TOKEN = "hf_test_token_value_0123456789"
USER = "alice"


@dataclass
class Hub:
    """What the stub holds: repos, their commits (commit oid -> {path: bytes}), LFS objects, jobs."""

    repos: dict[str, dict[str, Any]] = field(default_factory=dict)
    commits: dict[str, dict[str, dict[str, bytes]]] = field(default_factory=dict)
    lfs: dict[str, bytes] = field(default_factory=dict)
    jobs: list[dict[str, Any]] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)


def _unauthorized(request: Request) -> Response | None:
    if request.headers.get("authorization") != f"Bearer {TOKEN}":
        return JSONResponse({"error": "Invalid credentials in Authorization header"}, status_code=401)
    return None


def create_hub_app(hub: Hub) -> FastAPI:
    app = FastAPI()

    @app.middleware("http")
    async def record(request: Request, call_next: Any) -> Response:
        hub.calls.append(f"{request.method} {request.url.path}")
        # The LFS upload URL is pre-signed (the Hub hands out a storage URL): no token there.
        guarded = request.url.path.startswith("/api/") or ".git/" in request.url.path
        if guarded and (refused := _unauthorized(request)) is not None:
            return refused
        return await call_next(request)

    @app.get("/api/whoami-v2")
    async def whoami() -> dict[str, Any]:
        return {
            "type": "user",
            "name": USER,
            "fullname": "Alice",
            "orgs": [],
            "auth": {"type": "access_token"},
        }

    @app.post("/api/repos/create")
    async def create_repo(request: Request) -> Response:
        body = await request.json()
        repo_id = f"{body.get('organization') or USER}/{body['name']}"
        if repo_id in hub.repos:
            return JSONResponse({"error": "You already created this model repo", "url": f"/{repo_id}"}, 409)
        hub.repos[repo_id] = {"private": body.get("visibility") == "private", "head": None}
        return JSONResponse({"url": f"{request.base_url}{repo_id}", "name": repo_id})

    @app.post("/api/models/{namespace}/{name}/preupload/{revision}")
    async def preupload(namespace: str, name: str, revision: str, request: Request) -> dict[str, Any]:
        files = (await request.json())["files"]
        modes = []
        for f in files:
            binary = b"\x00" in base64.b64decode(f["sample"]) or f["path"].endswith((".whl", ".zip"))
            modes.append(
                {"path": f["path"], "uploadMode": "lfs" if binary else "regular", "shouldIgnore": False}
            )
        return {"files": modes}

    @app.post("/{namespace}/{name}.git/info/lfs/objects/batch")
    async def lfs_batch(namespace: str, name: str, request: Request) -> dict[str, Any]:
        body = await request.json()
        assert body["operation"] == "upload" and "basic" in body["transfers"], body
        objects = [
            {"oid": o["oid"], "size": o["size"], "authenticated": True,
             "actions": {"upload": {"href": f"{request.base_url}lfs/{o['oid']}", "header": {}}}}
            for o in body["objects"]
        ]  # fmt: skip
        return {"transfer": "basic", "objects": objects}

    @app.put("/lfs/{oid}")
    async def lfs_put(oid: str, request: Request) -> Response:
        data = await request.body()
        if hashlib.sha256(data).hexdigest() != oid:
            return JSONResponse({"error": "sha256 mismatch"}, status_code=400)
        hub.lfs[oid] = data
        return Response(status_code=200)

    @app.post("/api/models/{namespace}/{name}/commit/{revision}")
    async def commit(namespace: str, name: str, revision: str, request: Request) -> Response:
        repo_id = f"{namespace}/{name}"
        if repo_id not in hub.repos:
            return JSONResponse({"error": "Repository not found"}, status_code=404)
        parent = hub.repos[repo_id]["head"]
        files = dict(hub.commits.get(parent, {}))
        for line in (await request.body()).splitlines():
            entry = json.loads(line)
            value = entry["value"]
            if entry["key"] == "file":
                files[value["path"]] = base64.b64decode(value["content"])
            elif entry["key"] == "lfsFile":
                if value["oid"] not in hub.lfs:
                    return JSONResponse(
                        {"error": f"LFS object {value['oid']} was never uploaded"}, status_code=422
                    )
                files[value["path"]] = hub.lfs[value["oid"]]
        oid = hashlib.sha1(json.dumps(sorted((p, hashlib.sha256(b).hexdigest()) for p, b in files.items()))
                           .encode() + (parent or "").encode()).hexdigest()  # fmt: skip
        hub.commits[oid] = files
        hub.repos[repo_id]["head"] = oid
        return JSONResponse({"commitUrl": f"{request.base_url}{repo_id}/commit/{oid}", "commitOid": oid,
                             "success": True, "pullRequestUrl": None})  # fmt: skip

    @app.api_route("/{namespace}/{name}/resolve/{revision}/{path:path}", methods=["GET", "HEAD"])
    async def resolve(namespace: str, name: str, revision: str, path: str, request: Request) -> Response:
        if (refused := _unauthorized(request)) is not None:  # every repo here is private
            return refused
        repo = hub.repos.get(f"{namespace}/{name}")
        commit = revision if revision in hub.commits else (repo or {}).get("head")
        data = hub.commits.get(commit, {}).get(path)
        if data is None:
            return JSONResponse(
                {"error": "Entry not found"}, status_code=404, headers={"X-Error-Code": "EntryNotFound"}
            )
        headers = {"X-Repo-Commit": commit, "ETag": f'"{hashlib.sha256(data).hexdigest()}"',
                   "Content-Length": str(len(data))}  # fmt: skip
        return Response(b"" if request.method == "HEAD" else data, headers=headers,
                        media_type="application/octet-stream")  # fmt: skip

    @app.post("/api/jobs/{namespace}")
    async def run_job(namespace: str, request: Request) -> dict[str, Any]:
        spec = await request.json()
        hub.jobs.append({"namespace": namespace, **spec})
        return {
            "id": f"6650a1b2c3d4e5f6000000{len(hub.jobs):02d}", "createdAt": "2026-12-04T01:00:00.000Z",
            "dockerImage": spec.get("dockerImage"), "command": spec.get("command"),
            "arguments": spec.get("arguments", []), "environment": spec.get("environment", {}),
            "secrets": {k: None for k in spec.get("secrets", {})}, "flavor": spec.get("flavor"),
            "labels": spec.get("labels"), "status": {"stage": "RUNNING", "message": None},
            "owner": {"id": "u1", "name": namespace, "type": "user"},
        }  # fmt: skip

    return app
