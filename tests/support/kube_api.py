"""A stand-in for the Kubernetes API server on 127.0.0.1, for the worker's pod deletion cost: it
records every request the real `kubernetes` client sends, and answers as told (a pod, a 403, a 404,
or nothing at all), plus a kubeconfig file that points the client at it with a bearer token."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

TOKEN = "test-token-7f3a"


def write_kubeconfig(directory: Path, server: str) -> Path:
    """A kubeconfig naming `server` and TOKEN (JSON is YAML)."""
    path = directory / "kubeconfig"
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "test", "cluster": {"server": server}}],
        "users": [{"name": "test", "user": {"token": TOKEN}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}],
    }))
    return path


@dataclasses.dataclass(frozen=True)
class Request:
    method: str
    path: str
    content_type: str | None
    authorization: str | None
    body: bytes
    at: float  # time.monotonic() on arrival

    def json(self):
        return json.loads(self.body)

    @property
    def cost(self) -> str | None:
        """The deletion cost a PATCH asks for, if it names one."""
        try:
            return self.json()["metadata"]["annotations"]["controller.kubernetes.io/pod-deletion-cost"]
        except (ValueError, KeyError, TypeError):
            return None


class KubeApi:
    """`mode`: 'ok' (200 and the patched pod), 'forbidden' (403), 'not_found' (404), or 'hang'
    (read the request, then answer nothing until the client gives up or the server stops)."""

    def __init__(self, mode: str = "ok"):
        self.mode = mode
        self.requests: list[Request] = []
        self.open_hangs = 0       # hung requests whose client has not hung up yet
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_port}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="kube-api", daemon=True)

    def start(self) -> "KubeApi":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self._server.shutdown()
        self._server.server_close()

    def seen(self) -> list[Request]:
        with self._lock:
            return list(self.requests)

    def costs(self) -> list[str | None]:
        return [r.cost for r in self.seen()]

    def kubeconfig(self, directory: Path) -> Path:
        return write_kubeconfig(directory, self.url)

    def _handler_class(self):
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format, *args):
                pass

            def _receive(self) -> Request:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                request = Request(self.command, self.path, self.headers.get("Content-Type"),
                                  self.headers.get("Authorization"), body, time.monotonic())
                with api._lock:
                    api.requests.append(request)
                return request

            def do_PATCH(self):
                request = self._receive()
                if api.mode == "hang":
                    return self._hang()
                name = request.path.rsplit("/", 1)[-1]
                if api.mode == "forbidden":
                    return self._status(403, "Forbidden", f'pods "{name}" is forbidden: User '
                                        '"system:serviceaccount:jobs:default" cannot patch resource "pods"')
                if api.mode == "not_found" or not request.path.startswith("/api/v1/namespaces/"):
                    return self._status(404, "NotFound", f'pods "{name}" not found')
                namespace = request.path.split("/")[4]
                pod = {"apiVersion": "v1", "kind": "Pod",
                       "metadata": {"name": name, "namespace": namespace,
                                    "annotations": request.json()["metadata"]["annotations"]}}
                self._reply(200, pod)

            def do_GET(self):
                self._receive()
                self._status(404, "NotFound", "not served here")

            def _status(self, code: int, reason: str, message: str):
                self._reply(code, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                   "message": message, "reason": reason, "code": code})

            def _reply(self, code: int, document):
                body = json.dumps(document).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _hang(self):
                with api._lock:
                    api.open_hangs += 1
                self.connection.settimeout(0.05)
                try:
                    while not api._stopping.is_set():
                        try:
                            if not self.connection.recv(1):
                                return  # the client hung up: its timeout
                        except TimeoutError:
                            continue
                        except OSError:
                            return
                finally:
                    with api._lock:
                        api.open_hangs -= 1
                    self.close_connection = True

        return Handler
