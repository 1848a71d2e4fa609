"""A TCP proxy on 127.0.0.1 in front of one server, that can go silent.

`silence()` stops forwarding in both directions without closing anything: what the peers send
waits in the kernel's buffers, and every TCP segment is still acknowledged, as by a hung proxy or
pooler in between (keepalives and tcp_user_timeout see nothing wrong). New connections are
accepted and go silent too. `heal()` forwards again, the waiting bytes first, as a path that comes
back delivers what the peers retransmitted."""

from __future__ import annotations

import select
import socket
import threading


class SilentProxy:
    def __init__(self, target_port: int):
        self.target_port = target_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._flowing = threading.Event()
        self._flowing.set()
        self._closed = threading.Event()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, name="proxy-accept", daemon=True).start()

    def silence(self) -> None:
        self._flowing.clear()

    def heal(self) -> None:
        self._flowing.set()

    def close(self) -> None:
        self._closed.set()
        self._flowing.set()
        self._listener.close()
        with self._lock:
            for sock in self._sockets:
                try:
                    sock.close()
                except OSError:
                    pass

    def __enter__(self) -> "SilentProxy":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
                upstream = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:
                continue
            with self._lock:
                self._sockets += [client, upstream]
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), name="proxy-pump", daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while not self._closed.is_set():
                self._flowing.wait()  # silent: read nothing, so the bytes stay queued
                readable, _, _ = select.select([src], [], [], 0.1)
                if not readable or not self._flowing.is_set():
                    continue
                data = src.recv(65536)
                if not data:
                    break
                self._flowing.wait()
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
