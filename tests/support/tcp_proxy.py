"""The part every TCP proxy of the test tree shares: a listener on 127.0.0.1 in front of one
server, which connects each accepted client to the server and hands the pair to the subclass's
`serve(client, upstream)`; `close()` closes the listener and every socket. A subclass sets its
own attributes before calling `__init__`, which starts accepting."""

from __future__ import annotations

import socket
import threading


class TcpProxy:
    def __init__(self, target_port: int, target_host: str = "127.0.0.1"):
        self.target = (target_host, target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._closed = threading.Event()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, name="proxy-accept", daemon=True).start()

    def serve(self, client: socket.socket, upstream: socket.socket) -> None:
        """Start forwarding between a new client and its upstream connection (on threads)."""
        raise NotImplementedError

    def close(self) -> None:
        self._closed.set()
        self._listener.close()
        with self._lock:
            for sock in self._sockets:
                try:
                    sock.close()
                except OSError:
                    pass

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
                upstream = socket.create_connection(self.target)
            except OSError:
                continue
            with self._lock:
                self._sockets += [client, upstream]
            self.serve(client, upstream)
