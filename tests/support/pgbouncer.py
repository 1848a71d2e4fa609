"""A PgBouncer of a test's own (Debian's package, scripts/install-test-tools): its own port and
directory, trust authentication, one pool mode, in front of the test's database only. The shared
server behind it is not touched."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from tests.support.harness import free_port, wait_for


def pgbouncer_binary() -> str:
    found = shutil.which("pgbouncer") or next((p for p in ("/usr/sbin/pgbouncer", "/sbin/pgbouncer")
                                              if Path(p).exists()), None)
    if found is None:
        raise AssertionError("pgbouncer is not installed: run `make tools` (scripts/install-test-tools)")
    return found


class PgBouncer:
    """`PgBouncer(db_url, directory, "transaction").start()`; `.url` is db_url through it."""

    def __init__(self, db_url: str, directory: Path, pool_mode: str, pool_size: int = 40):
        self.target = conninfo_to_dict(db_url)
        self.directory, self.pool_mode, self.pool_size = directory, pool_mode, pool_size
        self.port = free_port()
        self.popen: subprocess.Popen | None = None
        self.log_path = directory / "pgbouncer.log"

    @property
    def url(self) -> str:
        return make_conninfo(**{**self.target, "host": "127.0.0.1", "port": str(self.port)})

    def _write_config(self) -> Path:
        self.directory.mkdir(parents=True, exist_ok=True)
        user, dbname = self.target.get("user", "postgres"), self.target["dbname"]
        users = self.directory / "users.txt"
        users.write_text(f'"{user}" ""\n')
        config = self.directory / "pgbouncer.ini"
        config.write_text(f"""\
[databases]
{dbname} = host={self.target.get("host", "127.0.0.1")} port={self.target.get("port", "5432")} dbname={dbname}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir =
auth_type = trust
auth_file = {users}
pool_mode = {self.pool_mode}
default_pool_size = {self.pool_size}
max_client_conn = 200
""")
        return config

    def start(self) -> "PgBouncer":
        config = self._write_config()
        command = [pgbouncer_binary(), str(config)]

        if os.geteuid() == 0:  # PgBouncer refuses to run as root; -u drops to nobody once the config is read
            command[1:1] = ["-u", "nobody"]
        with open(self.log_path, "wb") as out:
            self.popen = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)

        def answers():
            if self.popen.poll() is not None:
                raise AssertionError(f"pgbouncer exited ({self.popen.returncode}):\n{self.log()}")
            try:
                with psycopg.connect(self.url, connect_timeout=2) as conn:
                    return conn.execute("SELECT 1").fetchone() == (1,)
            except psycopg.OperationalError:
                return False

        wait_for(answers, 15, interval=0.1, message=f"pgbouncer ({self.pool_mode}) to answer")
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(10)
