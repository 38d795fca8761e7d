"""Ingest versus delivery of a forwarding archive (issue 12), counted apart.

    python -m loadtests.route --archive URL --sink URL --sink-data DIR [--clients 1,4] [--instances 200]
    python -m loadtests.route --spawn [--workers 2] [--clients 1,4] [--instances 200] [--size 512]
    python -m loadtests.route --spawn --via dimse [--dimse-port P] [--ae-title T] ...

With ``--via dimse`` the clients send C-STORE instead (pynetdicom SCU, one association
per client carrying all its instances; acknowledged = C-STORE-RSP status 0x0000 Success,
PS3.4 B.2.3) to the archive's DIMSE port; delivery and reconciliation are unchanged.

The archive forwards (``--routes``) to the sink. Per client count, the clients send
STOW-RS (one instance per request) of new MR images (``--size`` squared, 16 bits)
into one new study, and the runner reports:

- **ingest**: acknowledged instances per second on the sender's clock (first request
  sent to last answer received);
- **delivery**: instances per second from the first to the last arrival, on the
  **sink's clock**: the modification times of the sink's own stored files
  (``--sink-data``, the sink's data folder: it must be on this machine); and the
  lag of the last arrival behind the last acknowledgement;
- their ratio, the archive's queue depth (pending + in flight, ``GET /admin/queue``)
  sampled every 0.5 s, and a reconciliation: every acknowledged instance is at the
  sink exactly once (QIDO-RS on the sink; files per SOP Instance UID under
  ``--sink-data``), none missing, none extra; re-sends counted from the archive's
  outbox attempts (a receiver following our duplicate policy stores a re-sent
  byte-identical instance once and answers success).

``--spawn`` starts a sink archive (1 worker) and a forwarding archive (``--workers``)
in a temporary folder and removes them afterwards. Results go to stdout and, with
``--out``, to a markdown file.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from .common import fmt, machine, machine_md, table, wait_http
from .dataset import fixed_length_uid, stow_template

BOUNDARY = "route-load-boundary"
CTYPE = f'multipart/related; type="application/dicom"; boundary={BOUNDARY}'


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Spawned:
    """A sink archive and a forwarding archive in a temporary folder."""

    def __init__(self, workers: int, dimse: bool = False) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="route-load-"))
        self.sink_data = self.root / "sink"
        self.archive_data = self.root / "archive"
        sink_port, arch_port = _free_port(), _free_port()
        self.dimse_port = _free_port() if dimse else 0
        self.sink = f"http://127.0.0.1:{sink_port}"
        self.archive = f"http://127.0.0.1:{arch_port}"
        routes = self.root / "routes.toml"
        routes.write_text(f'[[destinations]]\nname = "sink"\nstow_url = "{self.sink}"\n'
                          '[[rules]]\nname = "everything"\ndestinations = ["sink"]\n')
        env = {k: v for k, v in os.environ.items() if not k.startswith("DICOMWEB_")}
        env["DICOMWEB_LOG_LEVEL"] = "warning"
        cmd = [sys.executable, "-m", "dicomweb_server.cli", "serve"]
        self.procs = [
            subprocess.Popen(cmd + ["--data-dir", str(self.sink_data), "--port", str(sink_port), "--workers", "1",
                                    "--dimse-port", "0"],
                             env=env, start_new_session=True),
            subprocess.Popen(cmd + ["--data-dir", str(self.archive_data), "--port", str(arch_port),
                                    "--workers", str(workers), "--routes", str(routes),
                                    "--dimse-port", str(self.dimse_port)],
                             env=env, start_new_session=True),
        ]
        wait_http(self.sink + "/studies?limit=1", proc=self.procs[0])
        wait_http(self.archive + "/studies?limit=1", proc=self.procs[1])
        if self.dimse_port:  # the DIMSE listener is its own process: wait until it accepts
            import socket

            deadline = time.monotonic() + 60
            while True:
                try:
                    socket.create_connection(("127.0.0.1", self.dimse_port), timeout=1).close()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
        shutil.rmtree(self.root, ignore_errors=True)


def queue_depth(archive: str) -> tuple[int, dict] | None:
    try:
        d = httpx.get(archive + "/admin/queue", timeout=10).json()["destinations"]
    except (httpx.HTTPError, ValueError, KeyError):
        return None
    return sum((s["pending"] or 0) + (s["in_flight"] or 0) for s in d.values()), d


def _dimse_client(dimse: tuple[str, int, str], base: bytes, count: int, ack) -> list[str]:
    """C-STORE ``count`` copies of ``base`` (new SOP Instance UIDs) over one association;
    ``ack(sop)`` on each C-STORE-RSP Success (0x0000, PS3.4 B.2.3). Returns the errors."""
    from io import BytesIO

    from pydicom import dcmread
    from pynetdicom import AE

    ds = dcmread(BytesIO(base))
    ae = AE(ae_title="ROUTELOAD")
    ae.acse_timeout = ae.dimse_timeout = ae.network_timeout = 120
    ae.add_requested_context(ds.SOPClassUID, [ds.file_meta.TransferSyntaxUID])
    host, port, called = dimse
    assoc = ae.associate(host, port, ae_title=called)
    if not assoc.is_established:
        return ["association refused or aborted"] * count
    errors: list[str] = []
    try:
        for _ in range(count):
            sop = fixed_length_uid()
            ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID = sop
            try:
                status = assoc.send_c_store(ds).get("Status")
            except Exception as e:  # noqa: BLE001 - a broken association is an error of the step
                errors.append(str(e))
                continue
            if status == 0:
                ack(sop)
            else:
                errors.append(f"C-STORE status {status}")
    finally:
        if assoc.is_established:
            assoc.release()
    return errors


def run_step(archive: str, sink: str, sink_data: Path, clients: int, n: int, size: int,
             archive_data: Path | None = None, dimse: tuple[str, int, str] | None = None) -> dict:
    """One step; ``dimse`` = (host, port, called AE title) sends C-STORE instead of STOW-RS."""
    template, (ph_study, ph_series, ph_sop) = stow_template(size)
    study = fixed_length_uid()
    series = [fixed_length_uid() for _ in range(clients)]
    body_size = len(template)
    acked: dict[str, str] = {}  # sop -> series
    ack_times: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    per_client = [n // clients + (1 if i < n % clients else 0) for i in range(clients)]

    def client(i: int) -> None:
        base = template.replace(ph_study.encode(), study.encode()).replace(ph_series.encode(), series[i].encode())
        if dimse is not None:
            def ack(sop: str) -> None:
                with lock:
                    acked[sop] = series[i]
                    ack_times.append(time.time())

            errs = _dimse_client(dimse, base, per_client[i], ack)
            with lock:
                errors.extend(errs)
            return
        with httpx.Client(timeout=120) as c:
            for _ in range(per_client[i]):
                sop = fixed_length_uid()
                data = base.replace(ph_sop.encode(), sop.encode())
                body = (f"--{BOUNDARY}\r\nContent-Type: application/dicom\r\n\r\n".encode() + data
                        + f"\r\n--{BOUNDARY}--\r\n".encode())
                try:
                    r = c.post(archive + "/studies", content=body, headers={"Content-Type": CTYPE})
                except httpx.HTTPError as e:
                    with lock:
                        errors.append(str(e))
                    continue
                with lock:
                    if r.status_code == 200:
                        acked[sop] = series[i]
                        ack_times.append(time.time())
                    else:
                        errors.append(f"HTTP {r.status_code}")

    depth: list[tuple[float, int]] = []
    stop = threading.Event()

    def sampler(t0: float) -> None:
        while not stop.is_set():
            q = queue_depth(archive)
            if q is not None:
                depth.append((time.time() - t0, q[0]))
            stop.wait(0.5)

    t0 = time.time()
    s = threading.Thread(target=sampler, args=(t0,), daemon=True)
    s.start()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    t_last_ack = max(ack_times) if ack_times else t0
    # wait until the archive owes nothing and the sink holds every acknowledged instance
    deadline = time.monotonic() + 600
    files: dict[str, Path] = {}
    while time.monotonic() < deadline:
        q = queue_depth(archive)
        files = {sop: sink_data / "blobs" / study / se / f"{sop}.dcm" for sop, se in acked.items()}
        if q is not None and q[0] == 0 and all(p.exists() for p in files.values()):
            break
        time.sleep(0.25)
    stop.set()
    s.join()
    mtimes = sorted(p.stat().st_mtime for p in files.values() if p.exists())
    # reconciliation on the sink: QIDO-RS lists each SOP Instance UID once; files per SOP
    listed: list[str] = []
    with httpx.Client(timeout=60) as c:
        offset = 0
        while True:
            r = c.get(f"{sink}/studies/{study}/instances", params={"limit": 1000, "offset": offset})
            page = r.json() if r.status_code == 200 and r.content else []
            listed += [x["00080018"]["Value"][0] for x in page]
            if len(page) < 1000:
                break
            offset += len(page)
    on_disk = {p.stem for p in (sink_data / "blobs" / study).rglob("*.dcm")}
    q = queue_depth(archive)
    resends = None
    if archive_data is not None:  # sends beyond the first, from the archive's outbox
        from dicomweb_server.routing import outbox_path
        from dicomweb_server.routing.outbox import SQLiteOutbox

        outbox = SQLiteOutbox(outbox_path(archive_data, "sqlite"))
        try:
            resends = sum(max(0, row["attempts"] - 1) for row in outbox.rows() if row["SOPInstanceUID"] in acked)
        finally:
            outbox.close()
    ingest_s = (t_last_ack - t0) if ack_times else None
    deliver_s = (mtimes[-1] - mtimes[0]) if len(mtimes) > 1 else None
    ingest = len(acked) / ingest_s if ingest_s else None
    delivery = len(mtimes) / deliver_s if deliver_s else None
    return {
        "via": "C-STORE" if dimse else "STOW-RS",
        "clients": clients, "sent": n, "acked": len(acked), "errors": len(errors), "body_bytes": body_size,
        "ingest_s": ingest_s, "ingest_per_s": ingest,
        "delivery_s": deliver_s, "delivery_per_s": delivery,
        "ratio": (ingest / delivery) if ingest and delivery else None,
        # first request sent (sender) to last arrival (sink): one host, one clock
        "end_to_end_per_s": len(mtimes) / (mtimes[-1] - t0) if mtimes else None,
        "lag_s": (mtimes[-1] - t_last_ack) if mtimes else None,  # sink clock minus sender clock: same host
        "depth": depth, "max_depth": max((d for _, d in depth), default=0),
        "at_sink": len(set(listed) & set(acked)), "listed_twice": len(listed) - len(set(listed)),
        "missing": len(set(acked) - set(listed)), "extra": len(set(listed) - set(acked)),
        "files": len(on_disk & set(acked)), "queue_after": q[1] if q else None, "resends": resends,
    }


def depth_line(depth: list[tuple[float, int]], every: float = 1.0) -> str:
    out, next_t = [], 0.0
    for t, d in depth:
        if t >= next_t:
            out.append(f"{t:.0f}s:{d}")
            next_t = t + every
    return " ".join(out)


def report(results: list[dict], args: argparse.Namespace, busy: str) -> str:
    size = results[0]["body_bytes"] if results else 0
    rows = [[r["clients"], r["acked"], fmt(r["ingest_per_s"]), fmt(r["delivery_per_s"]), fmt(r["ratio"], 2),
             fmt(r["end_to_end_per_s"]), fmt(r["lag_s"]), r["max_depth"], f"{r['at_sink']}/{r['acked']}",
             r["missing"], r["extra"], r["listed_twice"], fmt(r["resends"]), r["errors"]] for r in results]
    lines = [
        "# Routing: ingest vs delivery (`python -m loadtests.route`)",
        "",
        f"Objects: MR {args.size}x{args.size}, 16 bits allocated, Explicit VR Little Endian, "
        f"**{size:,} bytes** per PS3.10 file, ingest by "
        + ("C-STORE (one association per client, acknowledged = C-STORE-RSP Success)" if args.via == "dimse"
           else "STOW-RS (one instance per request)") + f"; the archive forwards every "
        f"instance to a sink archive by STOW-RS (batches of up to 20, 2 in flight). "
        f"Ingest: acknowledged/s on the sender's clock (first request to last acknowledgement: HTTP 200 or C-STORE-RSP 0x0000). Delivery: first to last "
        f"arrival on the **sink's clock** (mtime of the sink's stored files). Lag: last arrival after the last "
        f"acknowledgement; end-to-end: arrivals per second from the first request sent to the last arrival (same "
        f"host, so the two clocks are one).",
        "",
        table(["clients", "acked", "ingest/s", "delivered/s", "ingest:delivery", "end-to-end/s", "lag s", "max queue",
               "at sink", "missing", "extra", "listed twice", "re-sends", "errors"], rows),
        "",
        "Queue depth (pending + in flight at the archive) over time, per step:",
        "",
    ]
    for r in results:
        lines.append(f"- {r['clients']} client(s): {depth_line(r['depth'])}")
    lines += ["", f"Archive workers: {args.workers if args.spawn else 'as started'}. Machine during the run: {busy}",
              "", machine_md(machine())]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtests.route", description=__doc__.split("\n\n")[0])
    p.add_argument("--archive", help="the forwarding archive's DICOMweb root")
    p.add_argument("--sink", help="the sink's DICOMweb root")
    p.add_argument("--sink-data", type=Path, help="the sink's data folder (its files' mtimes are the sink's clock)")
    p.add_argument("--archive-data", type=Path, help="the archive's data folder (sqlite), to count re-sends")
    p.add_argument("--spawn", action="store_true", help="start a sink and a forwarding archive in a temp folder")
    p.add_argument("--workers", type=int, default=2, help="forwarding archive workers with --spawn")
    p.add_argument("--clients", default="1,4", help="client counts, comma separated")
    p.add_argument("--instances", type=int, default=200, help="instances per step")
    p.add_argument("--size", type=int, default=512, help="image rows = columns")
    p.add_argument("--via", choices=("stow", "dimse"), default="stow",
                   help="ingest by STOW-RS (default) or C-STORE to the archive's DIMSE port")
    p.add_argument("--dimse-host", default="127.0.0.1", help="the archive's DIMSE host with --via dimse")
    p.add_argument("--dimse-port", type=int, help="the archive's DIMSE port with --via dimse (free port with --spawn)")
    p.add_argument("--ae-title", default="DICOMWEB", help="the archive's AE title (called AE) with --via dimse")
    p.add_argument("--out", type=Path, help="also write the markdown report here")
    args = p.parse_args(argv)
    spawned = None
    if args.spawn:
        spawned = Spawned(args.workers, dimse=args.via == "dimse")
        args.dimse_port = spawned.dimse_port or args.dimse_port
        args.archive, args.sink, args.sink_data = spawned.archive, spawned.sink, spawned.sink_data
        args.archive_data = spawned.archive_data
    elif not (args.archive and args.sink and args.sink_data):
        p.error("give --archive, --sink and --sink-data, or --spawn")
    if args.via == "dimse" and not args.dimse_port:
        p.error("--via dimse needs --dimse-port (or --spawn)")
    dimse = (args.dimse_host, args.dimse_port, args.ae_title) if args.via == "dimse" else None
    try:
        load0 = os.getloadavg()
        results = []
        for n in (int(x) for x in args.clients.split(",")):
            r = run_step(args.archive.rstrip("/"), args.sink.rstrip("/"), args.sink_data, n, args.instances,
                         args.size, args.archive_data, dimse)
            print(f"{n} client(s): ingest {fmt(r['ingest_per_s'])}/s, delivery {fmt(r['delivery_per_s'])}/s, "
                  f"at sink {r['at_sink']}/{r['acked']}, missing {r['missing']}, extra {r['extra']}",
                  file=sys.stderr, flush=True)
            results.append(r)
        load1 = os.getloadavg()
    finally:
        if spawned is not None:
            spawned.close()
    busy = (f"load average {load0[0]:.1f} before, {load1[0]:.1f} after (1 min; {os.cpu_count()} cores, "
            "other engineers' tests running)")
    text = report(results, args, busy)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0 if all(r["missing"] == 0 and r["extra"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
