"""Helpers shared by the runners: the machine description, process-tree sampling,
server-side counts, small formatting helpers."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent


def machine() -> dict:
    """nproc, memory (free -h), CPU model, OS, Python and tool versions."""
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass

    def run(*cmd: str) -> str:
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    try:  # importing locust itself would monkey-patch this process (gevent)
        from importlib.metadata import version
        locust_v = version("locust")
    except Exception:  # pragma: no cover
        locust_v = "not installed"
    return {
        "nproc": os.cpu_count(),
        "free_h": run("free", "-h"),
        "cpu_model": cpu,
        "kernel": platform.release(),
        "python": sys.version.split()[0],
        "locust": locust_v,
        "wrk": run("sh", "-c", "wrk -v 2>&1 | head -1"),
    }


def machine_md(m: dict) -> str:
    return (f"- `nproc`: {m['nproc']}; CPU model: {m['cpu_model']}; kernel {m['kernel']}\n"
            f"- Python {m['python']}, locust {m['locust']}" + (f", {m['wrk']}" if m.get("wrk") else "") + "\n"
            f"- `free -h`:\n\n```\n{m['free_h']}\n```\n")


def process_tree(pid: int):
    import psutil

    try:
        p = psutil.Process(pid)
        return [p] + p.children(recursive=True)
    except psutil.Error:
        return []


def local_server_pid(url: str) -> int | None:
    """The process listening on a loopback URL's port (the top one of a uvicorn
    master and its workers, which share the socket), or None: remote, not found, or
    not visible to this user."""
    import ipaddress
    from urllib.parse import urlsplit

    import psutil

    parts = urlsplit(url)
    host, port = parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)
    try:
        if host != "localhost" and not ipaddress.ip_address(host).is_loopback:
            return None
        listening = {c.pid for c in psutil.net_connections(kind="tcp")
                     if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid}
    except (ValueError, psutil.Error):
        return None
    if not listening:
        return None
    # a worker may be the only one listed: climb to the top process of the same program
    # (uvicorn's parent), never to this process or its ancestors (a harness that started both)
    mine = {os.getpid(), *(p.pid for p in psutil.Process().parents())}
    try:
        proc = psutil.Process(min(listening))
        while (parent := proc.parent()) is not None and parent.pid not in mine and parent.exe() == proc.exe():
            proc = parent
    except psutil.Error:
        return None
    return proc.pid


def tree_rss_mb(pid: int) -> float | None:
    """RSS of a process and its descendants, MB (None when the process is gone)."""
    import psutil

    total, seen = 0, False
    for p in process_tree(pid):
        try:
            total += p.memory_info().rss
            seen = True
        except psutil.Error:
            continue
    return total / 1e6 if seen else None


class CpuSampler:
    """CPU use of a process tree, per process, from cpu_times deltas between samples."""

    def __init__(self) -> None:
        self.last: dict[int, tuple[float, float]] = {}
        self.busy: dict[int, float] = {}  # cpu seconds inside the window
        self.alive: dict[int, float] = {}  # wall seconds inside the window

    def sample(self, procs, in_window: bool) -> None:
        import psutil

        now = time.monotonic()
        for p in procs:
            try:
                t = p.cpu_times()
            except psutil.Error:
                continue
            cpu = t.user + t.system
            prev = self.last.get(p.pid)
            self.last[p.pid] = (now, cpu)
            if prev is not None and in_window:
                self.busy[p.pid] = self.busy.get(p.pid, 0.0) + (cpu - prev[1])
                self.alive[p.pid] = self.alive.get(p.pid, 0.0) + (now - prev[0])

    def per_process_pct(self) -> dict[int, float]:
        return {pid: 100.0 * self.busy[pid] / self.alive[pid] for pid in self.busy if self.alive.get(pid, 0) > 0.5}

    def total_pct(self) -> float:
        pp = self.per_process_pct()
        return sum(pp.values())

    def max_pct(self) -> float:
        pp = self.per_process_pct()
        return max(pp.values()) if pp else 0.0


class MachineCpu:
    """Busy CPU of the whole machine between the first and last in-window sample,
    in % of one core (200 % = both cores of a 2-core machine)."""

    def __init__(self) -> None:
        self.first = None
        self.last = None

    def sample(self, in_window: bool) -> None:
        import psutil

        if not in_window:
            return
        t = psutil.cpu_times()
        now = time.monotonic()
        if self.first is None:
            self.first = (now, t)
        self.last = (now, t)

    def busy_pct(self) -> float | None:
        if self.first is None or self.last is None or self.last[0] - self.first[0] < 0.5:
            return None
        (t0, a), (t1, b) = self.first, self.last

        def idle(x):
            return x.idle + getattr(x, "iowait", 0.0)

        busy = (sum(b) - idle(b)) - (sum(a) - idle(a))
        return 100.0 * busy / (t1 - t0)


def wait_quiet(max_wait: float = 60.0, busy_below: float = 30.0) -> tuple[float, float | None]:
    """Wait (at most ``max_wait`` s) until the machine's busy CPU over one second is
    below ``busy_below`` % of one core: on a shared machine, start a step when the
    others are quiet. Returns (seconds waited, last busy %)."""
    import psutil

    t0 = time.monotonic()
    busy = None
    psutil.cpu_percent(None)
    while time.monotonic() - t0 < max_wait:
        time.sleep(1.0)
        busy = psutil.cpu_percent(None) * (os.cpu_count() or 1)
        if busy < busy_below:
            break
    return round(time.monotonic() - t0, 1), busy


def _stow_patient_studies(c: httpx.Client, host: str, patient_id: str) -> list[dict]:
    """The STOW-RS load patient's studies on a server (QIDO-RS, paged, at most 500
    pages of 200), with NumberOfStudyRelatedInstances."""
    studies: list[dict] = []
    for _ in range(500):
        r = c.get(f"{host.rstrip('/')}/studies?PatientID={patient_id}&includefield=00201208"
                  f"&limit=200&offset={len(studies)}", headers={"Accept": "application/dicom+json"})
        if r.status_code == 204:
            break
        r.raise_for_status()
        page = r.json()
        studies += page
        if len(page) < 200:
            break
    return studies


def stow_patient_count(host: str, patient_id: str, timeout: float = 30.0) -> int | None:
    """Instances the server holds for the STOW-RS load patient (QIDO-RS, paged;
    None when the server cannot say)."""
    try:
        with httpx.Client(timeout=timeout) as c:
            studies = _stow_patient_studies(c, host, patient_id)
        return sum(int((s.get("00201208", {}).get("Value") or [0])[0]) for s in studies)
    except (httpx.HTTPError, ValueError):
        return None


def remove_stow_patient(host: str, patient_id: str, timeout: float = 600.0) -> int:
    """Delete every study of the STOW-RS load patient from a server, so that each run
    measures the data set at its reference size: without this, every run left
    ~8,000-17,000 more instances on both servers (the capacity runner calls it after its
    last step, and before its first for what an interrupted run left). Our
    archive: DICOMweb ``DELETE /studies/{uid}``; Orthanc (a ``.../dicom-web`` root, whose
    DICOMweb plugin has no DELETE): its REST API (``/tools/lookup``, ``DELETE
    /studies/{id}``). Returns the number of studies deleted."""
    with httpx.Client(timeout=timeout) as c:
        uids = [s["0020000D"]["Value"][0] for s in _stow_patient_studies(c, host, patient_id)]
        root = host.rstrip("/")
        orthanc = root.endswith("/dicom-web")
        for uid in dict.fromkeys(uids):
            if orthanc:
                rest = root.removesuffix("/dicom-web")
                for hit in c.post(f"{rest}/tools/lookup", content=uid).raise_for_status().json():
                    if hit.get("Type") == "Study":
                        c.delete(f"{rest}/studies/{hit['ID']}").raise_for_status()
            else:
                r = c.delete(f"{root}/studies/{uid}")
                if r.status_code not in (204, 404):
                    r.raise_for_status()
    return len(set(uids))


def fmt(v, digits: int = 1) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if abs(v) >= 1000:
            return f"{v:,.0f}"
        return f"{v:.{digits}f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def table(headers: list[str], rows: list[list]) -> str:
    """A markdown table (also readable in a terminal)."""
    cells = [[str(h) for h in headers]] + [[fmt(c) if not isinstance(c, str) else c for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(cells[0], widths)) + " |",
             "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    for r in cells[1:]:
        lines.append("| " + " | ".join(c.rjust(w) for c, w in zip(r, widths)) + " |")
    return "\n".join(lines)


def wait_http(url: str, timeout: float = 60.0, proc: subprocess.Popen | None = None,
              interval: float = 0.05) -> None:
    """Wait until ``url`` answers (any status below 500). While nothing listens on its port
    a TCP connect is refused at once; only then is an HTTP request sent, on one client for
    the whole wait: an ``httpx.get`` per attempt built a client and its SSL context each
    time (~60 ms of CPU, taken from the server that was starting: a serve started by the
    tests answered after 4.5 s instead of 2.4 s on the 2-core machine)."""
    deadline = time.monotonic() + timeout
    u = httpx.URL(url)
    address = (u.host, u.port or (443 if u.scheme == "https" else 80))
    last = None
    with httpx.Client(timeout=5) as client:
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"server exited with code {proc.returncode} before answering {url}")
            try:
                socket.create_connection(address, timeout=1).close()
                r = client.get(url)
                if r.status_code < 500:
                    return
                last = f"HTTP {r.status_code}"
            except (OSError, httpx.HTTPError) as e:
                last = str(e)
            time.sleep(interval)
    raise RuntimeError(f"{url} did not answer within {timeout:.0f} s ({last})")
