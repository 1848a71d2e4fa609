"""A TCP proxy on 127.0.0.1 in front of one Postgres server that makes commits ambiguous: for a
statement the test chooses, it forwards the statement, lets the server run it and commit, then
resets the client's connection instead of forwarding the answer. The client sees a connection
error and cannot tell whether its commit happened (it did).

It reads the wire protocol (version 3) just enough to know what each client runs:
- the simple protocol's Query ('Q'): its text (a COMMIT as psycopg sends one, a multi-statement);
- the extended protocol's Parse ('P', a statement's text under its name), Bind ('B', a portal of
  a named or unnamed statement) and Execute ('E', a portal): the text executed, prepared or not;
- the Syncs ('S') and Queries, each of which the server answers with one ReadyForQuery ('Z'), as
  it answers the startup: the n-th ReadyForQuery ends the n-th answer, so the proxy knows which of
  the server's messages answer the chosen statement. By that ReadyForQuery the server has
  committed it (an explicit COMMIT, or the implicit transaction of an autocommit statement, which
  ends at its Sync).

`cut(when, times)` chooses: `when(Statement)` is asked of every statement a client executes;
the first `times` for which it is true are cut. A Statement names the client's application_name
(from its startup message), the text, and, for a COMMIT, the texts run in its transaction.
`cuts` lists the statements cut so far.

Clients must not use TLS through it: `url()` gives a URL that says sslmode=disable."""

from __future__ import annotations

import dataclasses
import select
import socket
import struct
import threading
from collections.abc import Callable

import psycopg

from tests.support.tcp_proxy import TcpProxy

_SSL_REQUEST, _GSSENC_REQUEST, _CANCEL_REQUEST = 80877103, 80877104, 80877102


@dataclasses.dataclass(frozen=True)
class Statement:
    application_name: str
    text: str
    transaction: tuple[str, ...] = ()  # for a COMMIT: what ran since BEGIN

    @property
    def commit(self) -> bool:
        return self.text.strip().rstrip(";").strip().upper() in ("COMMIT", "END", "COMMIT TRANSACTION")


def _cstring(data: bytes, at: int) -> tuple[str, int]:
    end = data.index(b"\0", at)
    return data[at:end].decode("utf-8", "replace"), end + 1


def _split(buffer: bytes, typed: bool = True) -> tuple[bytes, bytes] | None:
    """The first whole message of `buffer` and the rest, or None while it is incomplete. A typed
    message has a type byte before its length; the startup's messages have none."""
    head = 1 if typed else 0
    if len(buffer) < head + 4:
        return None
    (length,) = struct.unpack("!i", buffer[head:head + 4])
    if len(buffer) < head + length:
        return None
    return buffer[:head + length], buffer[head + length:]


class _Link:
    """One client connection and its upstream: two pumps, and what they share under `lock`."""

    def __init__(self, proxy: "LostAnswerProxy", client: socket.socket, upstream: socket.socket):
        self.proxy, self.client, self.upstream = proxy, client, upstream
        self.lock = threading.Lock()
        self.application_name = ""
        self.statements: dict[str, str] = {}  # prepared statement name ("" unnamed) -> text
        self.portals: dict[str, str] = {}     # portal name -> text
        self.transaction: list[str] | None = None  # the texts run since BEGIN, if in one
        self.answers_asked = 0                 # startup, Queries and Syncs forwarded: one ReadyForQuery each
        self.answers_seen = 0                  # ReadyForQuery messages from the server
        self.untyped_answers = 0               # one-byte answers to SSL/GSS requests still to come
        self.cut_at: int | None = None         # the ReadyForQuery that ends the chosen answer
        self.closed = threading.Event()

    # ---- client -> server -------------------------------------------------------------------
    def client_pump(self) -> None:
        buffer, started = b"", False
        try:
            while (data := self._recv(self.client)):
                buffer += data
                out = bytearray()
                while (split := _split(buffer, typed=started)) is not None:
                    message, buffer = split
                    if started:
                        self._client_message(message[:1], message[5:])
                    else:
                        started = self._startup(message)
                    out += message
                # everything parsed so far goes on, the chosen statement included: the server must
                # receive and run it; only its answer is held back
                self.upstream.sendall(out)
        except OSError:
            pass
        finally:
            self.close()

    def _startup(self, message: bytes) -> bool:
        """Whether `message` (untyped) started the session; an SSL or GSS request does not."""
        code = struct.unpack("!i", message[4:8])[0]
        if code in (_SSL_REQUEST, _GSSENC_REQUEST):
            with self.lock:
                self.untyped_answers += 1
            return False
        if code != _CANCEL_REQUEST:
            parts = message[8:].split(b"\0")
            pairs = dict(zip(parts[0::2], parts[1::2]))
            self.application_name = pairs.get(b"application_name", b"").decode("utf-8", "replace")
            with self.lock:
                self.answers_asked += 1  # the server's answer to a startup ends with a ReadyForQuery
        return True

    def _client_message(self, kind: bytes, body: bytes) -> None:
        if kind == b"Q":
            text, _ = _cstring(body, 0)
            with self.lock:
                self.answers_asked += 1
                self._executed(text, self.answers_asked)
        elif kind == b"P":
            name, at = _cstring(body, 0)
            self.statements[name] = _cstring(body, at)[0]
        elif kind == b"B":
            portal, at = _cstring(body, 0)
            self.portals[portal] = self.statements.get(_cstring(body, at)[0], "")
        elif kind == b"E":
            portal, _ = _cstring(body, 0)
            with self.lock:
                # its implicit transaction (autocommit) ends at the next Sync
                self._executed(self.portals.get(portal, ""), self.answers_asked + 1)
        elif kind == b"S":
            with self.lock:
                self.answers_asked += 1

    def _executed(self, text: str, answer: int) -> None:
        """`text` runs; its answer ends with ReadyForQuery number `answer`. Under self.lock."""
        words = text.strip().upper()
        statement = Statement(self.application_name, text, tuple(self.transaction or ()))
        if words.startswith(("BEGIN", "START TRANSACTION")):
            self.transaction = []
        elif statement.commit or words.startswith(("ROLLBACK", "ABORT")):
            self.transaction = None
        elif self.transaction is not None:
            self.transaction.append(text)
        if self.cut_at is None and self.proxy._choose(statement):
            self.cut_at = answer

    # ---- server -> client -------------------------------------------------------------------
    def server_pump(self) -> None:
        buffer = b""
        try:
            while (data := self._recv(self.upstream)):
                buffer += data
                out, cut = bytearray(), False
                while buffer and not cut:
                    with self.lock:
                        untyped = self.untyped_answers
                        self.untyped_answers -= bool(untyped)
                    if untyped:
                        out, buffer = out + buffer[:1], buffer[1:]
                        continue
                    if (split := _split(buffer)) is None:
                        break
                    message, buffer = split
                    with self.lock:
                        # a message answers the chosen statement once every earlier answer is done
                        held = self.cut_at is not None and self.answers_seen >= self.cut_at - 1
                        if message[:1] == b"Z":
                            self.answers_seen += 1
                            cut = held and self.answers_seen == self.cut_at
                    if not held:
                        out += message
                self.client.sendall(out)
                if cut:
                    self.reset()
                    return
        except OSError:
            pass
        finally:
            self.close()

    # ---- ends -------------------------------------------------------------------------------
    def _recv(self, sock: socket.socket) -> bytes:
        while not self.closed.is_set():
            readable, _, _ = select.select([sock], [], [], 0.1)
            if readable:
                return sock.recv(65536)
        return b""

    def reset(self) -> None:
        """Abort the client's connection with a RST (no orderly FIN), and close the upstream one:
        the server has committed; its backend just ends."""
        try:
            self.client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
        self.close()

    def close(self) -> None:
        if self.closed.is_set():
            return
        self.closed.set()
        for sock in (self.client, self.upstream):
            try:
                sock.close()
            except OSError:
                pass


class LostAnswerProxy(TcpProxy):
    def __init__(self, target_port: int, target_host: str = "127.0.0.1"):
        self._when: Callable[[Statement], bool] | None = None
        self._times = 0
        self.cuts: list[Statement] = []
        super().__init__(target_port, target_host)

    def url(self, url: str) -> str:
        """`url` (a libpq URL or conninfo of the target server) through this proxy."""
        info = psycopg.conninfo.conninfo_to_dict(url)
        info.update(host="127.0.0.1", port=str(self.port), sslmode="disable", gssencmode="disable")
        return psycopg.conninfo.make_conninfo(**info)

    def cut(self, when: Callable[[Statement], bool], times: int = 1) -> None:
        """Cut the answer of the next `times` statements for which `when` is true."""
        with self._lock:
            self._when, self._times = when, times

    def _choose(self, statement: Statement) -> bool:
        with self._lock:
            if not self._times or self._when is None or not self._when(statement):
                return False
            self._times -= 1
            self.cuts.append(statement)
            return True

    def serve(self, client: socket.socket, upstream: socket.socket) -> None:
        link = _Link(self, client, upstream)
        threading.Thread(target=link.client_pump, name="proxy-client", daemon=True).start()
        threading.Thread(target=link.server_pump, name="proxy-server", daemon=True).start()
