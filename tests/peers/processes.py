"""A server process started by the peer tests on a free loopback port."""
from __future__ import annotations

import subprocess
import time
from pathlib import Path

import httpx


class PeerProcess:
    """Start ``argv``, wait until ``probe_url`` answers 200, stop it (only this process) at the end."""

    name = "peer"
    log: Path
    process: subprocess.Popen | None = None

    def spawn(self, argv: list[str], cwd: Path, probe_url: str, timeout: float = 30.0) -> None:
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(argv, cwd=cwd, stdout=log, stderr=log)
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.process.returncode}: {self._tail()}")
            try:
                if httpx.get(probe_url, timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{self.name} did not answer within {timeout:.0f} s: {self._tail()}")
            time.sleep(0.05)

    def _tail(self) -> str:
        return self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:  # pragma: no cover
                self.process.kill()
                self.process.wait()
