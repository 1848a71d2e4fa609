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

from tests.support.tcp_proxy import TcpProxy


class SilentProxy(TcpProxy):
    def __init__(self, target_port: int):
        self.target_port = target_port
        self._flowing = threading.Event()
        self._flowing.set()
        super().__init__(target_port)

    def silence(self) -> None:
        self._flowing.clear()

    def heal(self) -> None:
        self._flowing.set()

    def close(self) -> None:
        self._flowing.set()
        super().close()

    def serve(self, client: socket.socket, upstream: socket.socket) -> None:
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
