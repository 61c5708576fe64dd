"""A throwaway PostgreSQL cluster for tests and benchmarks (Debian's ``postgresql`` package).

``PostgresCluster`` runs ``initdb`` and ``pg_ctl`` from the server's binaries
(``/usr/lib/postgresql/*/bin``, or ``pg_config --bindir``) in a temporary
directory, listening on a free port of 127.0.0.1 only.  By default ``fsync`` and
``synchronous_commit`` are on (a commit is durable, as in production: the benchmarks);
``durable=False`` turns ``fsync`` off, as the test fixture ``pg_cluster`` does: a
commit then survives its client's SIGKILL and a clean restart (``pg_ctl restart -m
fast`` flushes everything), not a crash of the server or the machine, which no test
makes.  PostgreSQL
refuses to run as root: as root the server runs as the ``postgres`` user the
package creates (``runuser``).  TCP logins need the password (scram-sha-256),
so a wrong password is refused as on a real server.  ``database()`` hands out
a fresh, empty schema as a URL (``search_path`` set in the URL), which is far
cheaper than a database per test.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from typing import Any

PASSWORD = "fsm-test-password"
USER = "postgres"


def bin_dir() -> str | None:
    """The directory holding ``initdb`` and ``pg_ctl`` (newest major version), or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"),
                   key=lambda p: int(p.split("/")[4]) if p.split("/")[4].isdigit() else 0)
    if found:
        return os.path.dirname(found[-1])
    config = shutil.which("pg_config")
    if config:
        out = subprocess.run([config, "--bindir"], capture_output=True, text=True)
        path = out.stdout.strip()
        if os.path.exists(os.path.join(path, "pg_ctl")):
            return path
    return None


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PostgresCluster:
    """One PostgreSQL server in a temporary directory; ``start``, ``restart``, ``stop``.

    Raises ``RuntimeError`` (with the server's log tail) when it cannot start.
    """

    def __init__(self, bindir: str | None = None, *, max_connections: int = 200,
                 durable: bool = True) -> None:
        found = bindir or bin_dir()
        if found is None:
            raise RuntimeError("PostgreSQL server binaries not found "
                               "(apt-get install postgresql)")
        self.bindir: str = found
        self.max_connections = max_connections
        self.durable = durable
        self.root = tempfile.mkdtemp(prefix="fsm-pg-")
        self.data = os.path.join(self.root, "data")
        self.log = os.path.join(self.root, "server.log")
        self.port = free_port()
        self._as_root = os.geteuid() == 0
        if self._as_root:
            shutil.chown(self.root, USER, USER)
        os.chmod(self.root, 0o700)

    def _cmd(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        argv = list(args)
        if self._as_root:
            argv = ["runuser", "-u", USER, "--", *argv]
        out = subprocess.run(argv, capture_output=True, text=True, cwd=self.root)
        if check and out.returncode != 0:
            raise RuntimeError(f"{os.path.basename(args[0])} failed: "
                               f"{(out.stderr or out.stdout).strip()[-800:]}\n{self.log_tail()}")
        return out

    def log_tail(self, n: int = 20) -> str:
        """The last ``n`` lines of the server log."""
        try:
            with open(self.log, encoding="utf-8", errors="replace") as fh:
                return "".join(fh.readlines()[-n:])
        except OSError:
            return ""

    def start(self) -> PostgresCluster:
        """initdb (first time) and start; returns self once it accepts connections."""
        if not os.path.exists(self.data):
            pwfile = os.path.join(self.root, "pw")
            with open(pwfile, "w") as fh:
                fh.write(PASSWORD + "\n")
            if self._as_root:
                shutil.chown(pwfile, USER, USER)
            self._cmd(os.path.join(self.bindir, "initdb"), "-D", self.data, "-U", USER,
                      "--auth-local=trust", "--auth-host=scram-sha-256", f"--pwfile={pwfile}",
                      "-E", "UTF8", "--locale=C.UTF-8")
            os.remove(pwfile)
        fsync = "on" if self.durable else "off"
        options = (f"-c listen_addresses=127.0.0.1 -c port={self.port} "
                   f"-c unix_socket_directories={self.root} -c fsync={fsync} "
                   f"-c synchronous_commit=on -c max_connections={self.max_connections} "
                   "-c shared_buffers=64MB")
        self._cmd(os.path.join(self.bindir, "pg_ctl"), "-D", self.data, "-l", self.log,
                  "-o", options, "-w", "-t", "60", "start")
        return self

    def restart(self) -> None:
        """``pg_ctl restart -m fast``: every connection is dropped, the data kept."""
        self._cmd(os.path.join(self.bindir, "pg_ctl"), "-D", self.data, "-l", self.log,
                  "-m", "fast", "-w", "-t", "60", "restart")

    def stop(self) -> None:
        """Stop the server (fast) and delete its directory."""
        if os.path.exists(os.path.join(self.data, "postmaster.pid")):
            self._cmd(os.path.join(self.bindir, "pg_ctl"), "-D", self.data, "-m", "fast",
                      "-w", "stop", check=False)
        shutil.rmtree(self.root, ignore_errors=True)

    def url(self, dbname: str = "postgres", *, password: str = PASSWORD,
            schema: str | None = None) -> str:
        """A ``postgresql://`` URL of this server (``schema``: its ``search_path``)."""
        url = f"postgresql://{USER}:{password}@127.0.0.1:{self.port}/{dbname}"
        if schema:
            url += f"?options=-csearch_path%3D{schema}"
        return url

    def sql(self, statement: str, dbname: str = "postgres") -> list[tuple[Any, ...]]:
        """Run one statement as the superuser; its rows (empty for a command)."""
        import psycopg
        with psycopg.connect(self.url(dbname), autocommit=True) as conn:
            cur = conn.execute(statement)
            return cur.fetchall() if cur.description else []

    def database(self) -> str:
        """A fresh, empty schema in database ``postgres``, as a URL."""
        name = "t_" + uuid.uuid4().hex[:12]
        self.sql(f"CREATE SCHEMA {name}")
        return self.url(schema=name)

    def __enter__(self) -> PostgresCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
