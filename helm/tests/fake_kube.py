"""A tiny stand-in for the Kubernetes API server, enough for Helm's `lookup` of Secrets.

Helm renders "cluster-aware" (helm_python.Config.render) against it, so tests can show what the
chart does on install and upgrade in a cluster: which Secrets exist is up to the test.
Serves discovery for v1 and GET of Secrets (one, or the list of a namespace); nothing else.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

API_RESOURCES = {
    "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "v1",
    "resources": [{"name": "secrets", "singularName": "secret", "namespaced": True, "kind": "Secret",
                   "verbs": ["get", "list"]}],
}


class FakeKube:
    """Secrets by (namespace, name); `url` is the API server address while started."""

    def __init__(self) -> None:
        self.secrets: dict[tuple[str, str], dict] = {}
        self.requests: list[str] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_GET(self):  # noqa: N802 - http.server's name
                path = self.path.split("?")[0]
                owner.requests.append(path)
                parts = path.strip("/").split("/")
                if path == "/api/v1":
                    return self.reply(200, API_RESOURCES)
                if path == "/api":
                    return self.reply(200, {"kind": "APIVersions", "versions": ["v1"]})
                if path == "/apis":
                    return self.reply(200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": []})
                if parts[:3] == ["api", "v1", "namespaces"] and len(parts) >= 5 and parts[4] == "secrets":
                    ns = parts[3]
                    if len(parts) == 5:
                        items = [s for (n, _), s in sorted(owner.secrets.items()) if n == ns]
                        return self.reply(200, {"kind": "SecretList", "apiVersion": "v1", "metadata": {},
                                                "items": items})
                    secret = owner.secrets.get((ns, parts[5]))
                    if secret is not None:
                        return self.reply(200, secret)
                return self.reply(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                        "reason": "NotFound", "code": 404})

            def reply(self, code: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}"

    def put_secret(self, doc: dict) -> None:
        """Store a Secret as the API server would return it (as applied by helm install)."""
        meta = doc["metadata"]
        self.secrets[(meta["namespace"], meta["name"])] = {
            "apiVersion": "v1", "kind": "Secret", "type": doc.get("type", "Opaque"),
            "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
            "data": dict(doc.get("data", {})),
        }

    def __enter__(self) -> "FakeKube":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
