"""A throw-away PostgreSQL server for the tests (Debian's ``postgresql`` package):
initdb into a temp folder as a non-root user, listening on a free port of
127.0.0.1 with its socket in that folder, ``fsync = on``. Each test gets its own
schema (``search_path`` in the URL): no database to create, nothing to truncate.

Missing binaries FAIL with the install command; ``DICOMWEB_POSTGRES=skip`` skips
the PostgreSQL variants on purpose.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest

from tests.helpers import free_port

INSTALL = "apt-get install -y postgresql"


class PostgresServer:
    def __init__(self) -> None:
        bins = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
        if not bins:
            pytest.fail(f"PostgreSQL is not installed: {INSTALL} (or DICOMWEB_POSTGRES=skip to skip these tests)",
                        pytrace=False)
        self.bin = Path(bins[-1]).parent
        self.dir = Path(tempfile.mkdtemp(prefix="dicomweb-pg-"))
        self.port = free_port()
        self.user: str | None = None
        if os.geteuid() == 0:  # postgres refuses to run as root: Debian's package made this user
            self.user = "postgres"
            pw = pwd.getpwnam(self.user)
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
        data = self.dir / "data"
        self._run("initdb", "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C",
                  "--no-sync")
        self._run("pg_ctl", "-D", str(data), "-l", str(self.dir / "log"), "-w", "-t", "60", "-o",
                  f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.dir} -c fsync=on "
                  "-c synchronous_commit=on -c max_connections=200 -c shared_buffers=32MB", "start")
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, tool: str, *args: str) -> None:
        cmd = [str(self.bin / tool), *args]
        if self.user:
            cmd = ["runuser", "-u", self.user, "--", *cmd]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if proc.returncode:
            log = self.dir / "log"
            raise RuntimeError(f"{tool} failed: {proc.stderr}{log.read_text() if log.exists() else ''}")

    def fresh_url(self) -> str:
        """URL of a new, empty schema (the tables an index creates land there)."""
        import psycopg

        name = "t_" + uuid.uuid4().hex[:16]
        with psycopg.connect(self.url, autocommit=True) as con:
            con.execute(f"CREATE SCHEMA {name}")
        return f"{self.url}?options=-csearch_path%3D{name}"

    def stop(self) -> None:
        try:
            self._run("pg_ctl", "-D", str(self.dir / "data"), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


def skipped() -> bool:
    return os.environ.get("DICOMWEB_POSTGRES", "").lower() == "skip"
