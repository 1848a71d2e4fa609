"""Locate or start a PostgreSQL server for skiplock's tests and benchmarks.

Two ways to get a server:

* ``find_server_url()`` returns the URL of an existing server: the one named by
  ``$SKIPLOCK_TEST_DATABASE_URL`` or, failing that, a trust-auth server on
  ``127.0.0.1:5432`` (``postgresql://postgres@127.0.0.1:5432/postgres``).
* ``ThrowawayCluster`` initdb's and runs a private cluster in a temporary
  directory, for tests that must restart, stop or SIGKILL the server (which
  must never be done to a shared server). It is tuned for speed, not
  durability (fsync=off, ...), and listens only on 127.0.0.1 on its own port
  with its Unix socket inside its own directory.

``ensure_server()`` combines the two. Only the standard library and psycopg are
used. Binaries come from Debian's ``/usr/lib/postgresql/<version>/bin`` (highest
version) or, if those are absent, from the ``pgserver`` PyPI package. When run
as root, every Postgres program is run as the ``postgres`` OS user through
``runuser`` (or ``su``) because Postgres refuses to run as root.

Command line (used by the Makefile for a message; starts nothing)::

    python tests/pgcluster.py url   # prints a reachable server's URL, exit 1 if none
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import re
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping

import psycopg

__all__ = [
    "ENV_VAR",
    "LOCAL_URL",
    "free_port",
    "ThrowawayCluster",
    "ensure_server",
    "find_server_url",
]

ENV_VAR = "SKIPLOCK_TEST_DATABASE_URL"
LOCAL_URL = "postgresql://postgres@127.0.0.1:5432/postgres"

STARTUP_TIMEOUT = 30.0  # seconds for the server to accept connections
_STOP_TIMEOUT = 30  # seconds, passed to pg_ctl -t
_CMD_TIMEOUT = 120.0  # hard limit for any single subprocess
_LOG_TAIL_LINES = 40

# Settings for fast, disposable test clusters. Values may be overridden via
# ThrowawayCluster(settings=...).
FAST_SETTINGS: dict[str, Any] = {
    "fsync": False,
    "synchronous_commit": False,
    "full_page_writes": False,
    "max_connections": 200,
}


def _can_connect(url: str, timeout: int = 2) -> bool:
    try:
        with psycopg.connect(url, connect_timeout=timeout, autocommit=True) as conn:
            conn.execute("SELECT 1")
        return True
    except Exception:
        return False


def find_server_url(url: str | None = None) -> str | None:
    """Return the URL of an already running server, or None.

    ``url`` (the test suite passes the ``$SKIPLOCK_TEST_DATABASE_URL`` it read
    before scrubbing its environment), else ``$SKIPLOCK_TEST_DATABASE_URL``,
    wins if set (it is not probed); otherwise the local trust-auth server on
    127.0.0.1:5432 is used if it answers within 2 seconds.
    """
    url = url or os.environ.get(ENV_VAR)
    if url:
        return url
    if _can_connect(LOCAL_URL, timeout=2):
        return LOCAL_URL
    return None


def ensure_server(url: str | None = None) -> tuple[str, ThrowawayCluster | None]:
    """Return ``(url, cluster)``: an existing server, or a freshly started one.

    ``url`` as for ``find_server_url()``. ``cluster`` is None when an existing
    server was found; otherwise it is a running ThrowawayCluster that the
    caller must ``cleanup()``.
    """
    url = find_server_url(url)
    if url is not None:
        return url, None
    cluster = ThrowawayCluster()
    cluster.start()
    return cluster.url, cluster


# --------------------------------------------------------------------------
# binaries


def _version_key(name: str) -> tuple[int, ...]:
    return tuple(int(part) for part in name.split("."))


def _debian_bindir() -> Path | None:
    """Highest-version ``/usr/lib/postgresql/<v>/bin`` holding initdb/pg_ctl/postgres."""
    root = Path("/usr/lib/postgresql")
    if not root.is_dir():
        return None
    candidates = []
    for entry in root.iterdir():
        if not re.fullmatch(r"\d+(\.\d+)*", entry.name):
            continue
        bindir = entry / "bin"
        if all((bindir / prog).is_file() for prog in ("initdb", "pg_ctl", "postgres")):
            candidates.append((_version_key(entry.name), bindir))
    if not candidates:
        return None
    return max(candidates)[1]


def _pgserver_bindir() -> Path | None:
    """``pginstall/bin`` of the installed pgserver package (found without importing it).

    pgserver itself uses ``Path(pgserver._commands.__file__).parent / "pginstall" / "bin"``;
    importing pgserver has side effects, so only its package location is looked up.
    """
    try:
        spec = importlib.util.find_spec("pgserver")
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    locations = list(spec.submodule_search_locations or [])
    if not locations and spec.origin:
        locations = [str(Path(spec.origin).parent)]
    for loc in locations:
        bindir = Path(loc) / "pginstall" / "bin"
        if all((bindir / prog).is_file() for prog in ("initdb", "pg_ctl", "postgres")):
            return bindir
    return None


def _resolve_bindir(binaries: str | os.PathLike[str]) -> Path:
    if binaries == "auto":
        bindir = _debian_bindir() or _pgserver_bindir()
        if bindir is None:
            raise RuntimeError(
                "no PostgreSQL binaries found: install Debian's postgresql package "
                "(/usr/lib/postgresql/<version>/bin) or the 'pgserver' Python package"
            )
        return bindir
    if binaries == "debian":
        bindir = _debian_bindir()
        if bindir is None:
            raise RuntimeError("no Debian PostgreSQL binaries under /usr/lib/postgresql/*/bin")
        return bindir
    if binaries == "pgserver":
        bindir = _pgserver_bindir()
        if bindir is None:
            raise RuntimeError("the 'pgserver' package (with pginstall/bin) is not installed")
        return bindir
    bindir = Path(binaries)
    if not (bindir / "pg_ctl").is_file():
        raise RuntimeError(f"{bindir} does not contain pg_ctl")
    return bindir


# --------------------------------------------------------------------------
# process helpers


# Ports for the servers tests start: below the kernel's ephemeral range (32768 and up on Linux), so
# that no outgoing connection takes one between its pick and the server's bind, and one slice per
# pytest-xdist worker, so that two workers never pick the same one. A port the kernel gives for
# bind(0) is only free at that moment: two processes may be given the same one, and a server that
# then fails to bind leaves its test talking to another test's server on that port.
_PORTS_FIRST, _PORTS_END = 20000, 32768
_PORTS_SLICES = 16
_ports_next: list[int] = []


def _port_slice() -> range:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    index = int(worker[2:]) % _PORTS_SLICES if worker.startswith("gw") and worker[2:].isdigit() else 0
    size = (_PORTS_END - _PORTS_FIRST) // _PORTS_SLICES
    return range(_PORTS_FIRST + index * size, _PORTS_FIRST + (index + 1) * size)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on, from this process's slice, in turn (a port
    just released is not handed out again until the slice comes round)."""
    ports = _port_slice()
    if not _ports_next:
        _ports_next.append(ports.start + os.getpid() % len(ports))
    for _ in range(len(ports)):
        port = _ports_next[0]
        _ports_next[0] = ports.start + (port + 1 - ports.start) % len(ports)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {ports.start}-{ports.stop - 1}")


def _proc_state(pid: int) -> str | None:
    """Linux process state letter ('R', 'S', 'Z', ...) or None if gone."""
    try:
        data = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            return "?"
        return "?"
    # "pid (comm) state ppid ..." -- comm may contain spaces/parens.
    return data[data.rindex(")") + 2]


def _alive(pid: int) -> bool:
    state = _proc_state(pid)
    return state is not None and state not in ("Z", "X")


def _children_of(pid: int) -> list[int]:
    kids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            data = (entry / "stat").read_text()
        except OSError:
            continue
        fields = data[data.rindex(")") + 2 :].split()
        if len(fields) > 1 and fields[1] == str(pid):
            kids.append(int(entry.name))
    return kids


def _wait_gone(pids: list[int], deadline: float) -> list[int]:
    """Wait (polling) until all pids are dead or zombies; return survivors."""
    remaining = [p for p in pids if _alive(p)]
    while remaining and time.monotonic() < deadline:
        time.sleep(0.02)
        remaining = [p for p in remaining if _alive(p)]
    return remaining


def _others_can_traverse(path: Path) -> bool:
    path = path.resolve()
    for part in [path, *path.parents]:
        try:
            if not os.stat(part).st_mode & stat.S_IXOTH:
                return False
        except OSError:
            return False
    return True


def _conf_value(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, (int, float)):
        return str(value)
    return "'" + str(value).replace("'", "''") + "'"


# --------------------------------------------------------------------------
# the cluster


class ThrowawayCluster:
    """A private, disposable PostgreSQL cluster in a temporary directory.

    Usage::

        with ThrowawayCluster() as pg:          # initdb + start
            conn = psycopg.connect(pg.url)
            pg.restart()                        # pg_ctl restart -m fast -w
            pg.kill()                           # SIGKILL the postmaster
            pg.start()                          # crash recovery on the same data dir
            standby = pg.standby()              # pg_basebackup -R, started, streaming
            pg.stop("immediate"); standby.promote()
        # cleanup(): stopped and directory removed

    ``port``: TCP port on 127.0.0.1 (default: a free one). ``binaries``:
    ``"auto"`` (Debian, then pgserver), ``"debian"``, ``"pgserver"`` or a bin
    directory. ``settings``: extra/overriding postgresql.conf settings.
    ``os_user``: the OS user the server runs as when the caller is root.
    """

    def __init__(
        self,
        port: int | None = None,
        *,
        binaries: str | os.PathLike[str] = "auto",
        settings: Mapping[str, Any] | None = None,
        os_user: str = "postgres",
    ) -> None:
        self._auto_port = port is None
        self.port: int = port if port is not None else free_port()
        self.bindir: Path = _resolve_bindir(binaries)
        self.settings: dict[str, Any] = {**FAST_SETTINGS, **(settings or {})}
        self._os_user = os_user
        self._as_root = hasattr(os, "geteuid") and os.geteuid() == 0
        self.base_dir: Path | None = None
        self._atexit_registered = False

    # ---- paths / info -------------------------------------------------

    @property
    def url(self) -> str:
        """libpq URL of the ``postgres`` database as superuser ``postgres``."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    @property
    def data_dir(self) -> Path:
        return self._require_base() / "data"

    @property
    def log_path(self) -> Path:
        return self._require_base() / "server.log"

    def _require_base(self) -> Path:
        if self.base_dir is None:
            raise RuntimeError("cluster not initialised: call start() first")
        return self.base_dir

    @property
    def pid(self) -> int | None:
        """PID of the running postmaster, or None."""
        if self.base_dir is None:
            return None
        pid = self._pidfile_pid()
        return pid if pid is not None and _alive(pid) else None

    def is_running(self) -> bool:
        return self.pid is not None

    def log_tail(self, lines: int = _LOG_TAIL_LINES) -> str:
        if self.base_dir is None:
            return "(no server log)"
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no server log)"
        return "\n".join(text.splitlines()[-lines:])

    def _pidfile_pid(self) -> int | None:
        try:
            first = (self.data_dir / "postmaster.pid").read_text().split("\n", 1)[0]
            return int(first.strip())
        except (OSError, ValueError):
            return None

    # ---- running programs ---------------------------------------------

    def _wrap(self, argv: list[str]) -> list[str]:
        if not self._as_root:
            return argv
        runuser = shutil.which("runuser")
        if runuser:
            return [runuser, "-u", self._os_user, "--", *argv]
        su = shutil.which("su")
        if su:
            return [su, self._os_user, "-s", "/bin/sh", "-c", shlex.join(argv)]
        raise RuntimeError("running as root but neither runuser nor su is available")

    def _run(self, prog: str, *args: str, check: bool = True) -> tuple[int, str]:
        argv = self._wrap([str(self.bindir / prog), *args])
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        # Temp file rather than a pipe: a pipe inherited by the postmaster
        # could keep communicate() waiting forever.
        with tempfile.TemporaryFile("w+") as out:
            try:
                proc = subprocess.run(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    cwd=self.base_dir,
                    env=env,
                    text=True,
                    timeout=_CMD_TIMEOUT,
                )
                rc = proc.returncode
            except subprocess.TimeoutExpired:
                rc = -1
            out.seek(0)
            output = out.read()
        if check and rc != 0:
            raise RuntimeError(
                f"{shlex.join(argv)} failed (exit {rc}):\n{output.strip()}\n"
                f"--- server log tail ({self.log_path if self.base_dir else '-'}) ---\n"
                f"{self.log_tail()}"
            )
        return rc, output

    # ---- lifecycle ----------------------------------------------------

    def _make_base(self) -> None:
        parent = Path(tempfile.gettempdir())
        if self._as_root and not _others_can_traverse(parent):
            parent = Path("/tmp")
        base = Path(tempfile.mkdtemp(prefix="skiplock-pg-", dir=parent))
        if self._as_root:
            import pwd

            try:
                pw = pwd.getpwnam(self._os_user)
            except KeyError:
                shutil.rmtree(base, ignore_errors=True)
                raise RuntimeError(
                    f"running as root, but OS user {self._os_user!r} (needed to run "
                    "Postgres, which refuses root) does not exist"
                ) from None
            os.chown(base, pw.pw_uid, pw.pw_gid)
        self.base_dir = base
        if not self._atexit_registered:
            atexit.register(self.cleanup)
            self._atexit_registered = True

    def _initdb(self) -> None:
        self._run(
            "initdb",
            "-D", str(self.data_dir),
            "-U", "postgres",
            "-A", "trust",
            "-E", "UTF8",
            "--no-locale",
            "--no-sync",
        )  # fmt: skip
        with open(self.data_dir / "postgresql.conf", "a") as conf:
            conf.write("\n# added by skiplock tests/pgcluster.py\ninclude 'skiplock_test.conf'\n")
        self._write_conf()

    def _write_conf(self) -> None:
        values: dict[str, Any] = {
            "listen_addresses": "127.0.0.1",
            "port": self.port,
            "unix_socket_directories": str(self.base_dir),
            **self.settings,
        }
        path = self.data_dir / "skiplock_test.conf"
        path.write_text("".join(f"{k} = {_conf_value(v)}\n" for k, v in values.items()))
        st = os.stat(self.data_dir)
        if self._as_root:
            os.chown(path, st.st_uid, st.st_gid)

    def start(self) -> ThrowawayCluster:
        """initdb (first time only) and start the server; wait until it accepts connections."""
        if self.base_dir is None:
            self._make_base()
            self._initdb()
        if self.is_running():
            return self
        for attempt in range(3):
            self._clear_zombie_pidfile()
            rc, output = self._run(
                "pg_ctl", "start",
                "-D", str(self.data_dir),
                "-l", str(self.log_path),
                "-w", "-t", str(int(STARTUP_TIMEOUT)),
                check=False,
            )  # fmt: skip
            if rc == 0:
                break
            port_clash = "could not bind" in self.log_tail() or "in use" in self.log_tail()
            if self._auto_port and port_clash and attempt < 2:
                self.port = free_port()
                self._write_conf()
                continue
            raise RuntimeError(
                f"PostgreSQL did not start (pg_ctl exit {rc}) on port {self.port}:\n"
                f"{output.strip()}\n--- server log tail ({self.log_path}) ---\n{self.log_tail()}"
            )
        self._wait_ready(time.monotonic() + STARTUP_TIMEOUT)
        return self

    def restart(self, mode: str = "fast") -> ThrowawayCluster:
        """``pg_ctl restart -m <mode> -w``; wait until it accepts connections."""
        self._require_base()
        self._clear_zombie_pidfile()
        self._run(
            "pg_ctl", "restart",
            "-D", str(self.data_dir),
            "-l", str(self.log_path),
            "-m", mode,
            "-w", "-t", str(int(STARTUP_TIMEOUT)),
        )  # fmt: skip
        self._wait_ready(time.monotonic() + STARTUP_TIMEOUT)
        return self

    def stop(self, mode: str = "fast") -> None:
        """``pg_ctl stop -m <mode> -w``; no-op if the server is not running."""
        if not self.is_running():
            return
        self._run(
            "pg_ctl", "stop", "-D", str(self.data_dir), "-m", mode, "-w", "-t", str(_STOP_TIMEOUT)
        )

    def standby(self, settings: Mapping[str, Any] | None = None) -> ThrowawayCluster:
        """A streaming standby of this (running) cluster, started: a new cluster on its own port
        and directory, made by ``pg_basebackup -R`` from this one. It answers read-only queries
        until ``promote()``; the caller cleans it up like any cluster."""
        replica = ThrowawayCluster(binaries=self.bindir, settings={**self.settings, **(settings or {})},
                                   os_user=self._os_user)
        replica._make_base()
        replica._run(
            "pg_basebackup",
            "-D", str(replica.data_dir),
            "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres",
            "-X", "stream", "-c", "fast", "-R", "--no-sync",
        )  # fmt: skip
        replica._write_conf()  # its own port and socket directory, not the primary's
        return replica.start()

    def promote(self) -> None:
        """``pg_ctl promote -w``: a standby becomes a primary that accepts writes."""
        self._run("pg_ctl", "promote", "-D", str(self.data_dir), "-w", "-t", str(int(STARTUP_TIMEOUT)))

    def kill(self) -> None:
        """SIGKILL the postmaster (simulated crash) and wait for its children to exit.

        The orphaned backends/auxiliary processes notice the postmaster's death and
        exit by themselves; any still alive after 10 s are SIGKILLed so that a
        following start() (which performs crash recovery) is not blocked.
        """
        pid = self.pid
        if pid is None:
            raise RuntimeError("cannot kill: server is not running")
        children = _children_of(pid)
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        _wait_gone([pid], deadline)
        survivors = _wait_gone(children, deadline)
        for child in survivors:
            try:
                os.kill(child, signal.SIGKILL)
            except ProcessLookupError:
                pass
        _wait_gone(survivors, time.monotonic() + 5)

    def cleanup(self) -> None:
        """Stop the server (killing it if need be) and delete its directory. Idempotent."""
        if self._atexit_registered:
            atexit.unregister(self.cleanup)
            self._atexit_registered = False
        if self.base_dir is None:
            return
        try:
            self.stop("fast")
        except Exception:
            try:
                self.stop("immediate")
            except Exception:
                if self.is_running():
                    self.kill()
        self._remove_stale_shmem()
        shutil.rmtree(self.base_dir, ignore_errors=True)
        self.base_dir = None

    def __enter__(self) -> ThrowawayCluster:
        try:
            return self.start()
        except BaseException:
            self.cleanup()  # the RuntimeError already carries the log tail
            raise

    def __exit__(self, *exc: object) -> None:
        self.cleanup()

    def __repr__(self) -> str:
        return f"<ThrowawayCluster {self.url} dir={self.base_dir} running={self.is_running()}>"

    # ---- internals ----------------------------------------------------

    def _wait_ready(self, deadline: float) -> None:
        last: Exception | None = None
        while True:
            try:
                with psycopg.connect(self.url, connect_timeout=2, autocommit=True) as conn:
                    conn.execute("SELECT 1")
                return
            except psycopg.Error as exc:
                last = exc
            if not self.is_running() or time.monotonic() >= deadline:
                raise RuntimeError(
                    f"PostgreSQL at {self.url} is not accepting connections "
                    f"(running={self.is_running()}, last error: {last}).\n"
                    f"--- server log tail ({self.log_path}) ---\n{self.log_tail()}"
                )
            time.sleep(0.05)

    def _clear_zombie_pidfile(self) -> None:
        """Remove lock files naming an unreaped (zombie) postmaster.

        After kill() the dead postmaster is reparented to PID 1, which may reap it
        only later (about 1 s in some containers). Postgres treats a PID in
        postmaster.pid or the socket's .lock file as "another postmaster is
        running" while kill(pid, 0) succeeds, which it does for a zombie. Dead
        PIDs are left alone: Postgres cleans those up itself (incl. shared memory).
        """
        pid = self._pidfile_pid()
        if pid is None or _proc_state(pid) not in ("Z", "X"):
            return
        self._remove_stale_shmem()
        lock_files = [self.data_dir / "postmaster.pid"]
        lock_files += self._require_base().glob(".s.PGSQL.*.lock")
        for path in lock_files:
            try:
                if path.read_text().split("\n", 1)[0].strip() == str(pid):
                    path.unlink()
            except (OSError, ValueError):
                pass

    def _remove_stale_shmem(self) -> None:
        """Best effort: drop the SysV shared memory segment of a dead postmaster."""
        if self.base_dir is None or self.is_running():
            return
        try:
            lines = (self.data_dir / "postmaster.pid").read_text().splitlines()
            shmid = int(lines[6].split()[1])
        except (OSError, IndexError, ValueError):
            return
        try:
            for row in Path("/proc/sysvipc/shm").read_text().splitlines()[1:]:
                cols = row.split()
                if int(cols[1]) == shmid and int(cols[6]) == 0:  # shmid, nattch
                    ipcrm = shutil.which("ipcrm")
                    if ipcrm:
                        subprocess.run(
                            [ipcrm, "-m", str(shmid)],
                            stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL,
                            timeout=10,
                        )
                    break
        except (OSError, IndexError, ValueError, subprocess.SubprocessError):
            pass


def _main(argv: list[str]) -> int:
    if argv == ["url"]:
        url = find_server_url()
        if url is None:
            print(
                f"no reachable PostgreSQL server (set {ENV_VAR} or run one on 127.0.0.1:5432)",
                file=sys.stderr,
            )
            return 1
        print(url)
        return 0
    print(f"usage: {Path(sys.argv[0]).name} url", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
