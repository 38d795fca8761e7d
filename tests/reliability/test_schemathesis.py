"""schemathesis fuzzes every operation of the app's OpenAPI document against a
live archive: no answer may be a server error (issue #6)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.helpers import LiveServer, make_dataset, multipart, to_bytes


def test_no_server_errors(tmp_path):
    st = shutil.which("st") or str(Path(sys.executable).with_name("st"))
    srv = LiveServer(tmp_path / "data", "sqlite").start()
    try:
        import httpx

        body, ctype = multipart([to_bytes(make_dataset())])
        httpx.post(srv.url + "/studies", content=body, headers={"Content-Type": ctype})
        r = subprocess.run(
            [st, "run", srv.url + "/openapi.json", "--checks", "not_a_server_error", "--max-examples", "10",
             "--phases", "fuzzing", "--seed", "1", "-w", "2", "--no-color"],
            capture_output=True, text=True, timeout=300,
        )
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
        assert "passed" in r.stdout and "failed" not in r.stdout.split("SUMMARY")[-1].lower()
    finally:
        srv.stop()
