"""Study ``$update`` time and change feed read rate, through the real HTTP server
(``python -m dicomweb_server.cli serve``, SQLite index or PostgreSQL (tests/postgres.py's
throw-away server), local files, default workers).

- Builds studies of N small instances (64x64 16-bit MR made with pydicom, STOW-RS in
  batches of 100) in a fresh archive, then times ``POST /studies/{uid}/$update`` of each
  (PatientName + PatientID) for N = 100, 1,000, 3,000: the HTTP round trip and the
  server's own ``seconds``.
- Readers during an update: the largest study is updated a second time while one client
  polls QIDO-RS ``/studies/{uid}/instances`` (PatientName, PatientID included) in a loop.
  Every answer must hold all N instances and all-old or all-new values (docs/updates.md,
  "one switch per study"); counts the answers and their latency p50/p99.
- The change feed: reads the whole feed with ``/changefeed?offset=&limit=100`` (v1), with
  metadata (the default) and with ``includemetadata=false``; entries/s.

    PYTHONPATH=. python benchmarks/lifecycle.py [--sizes 100,1000,3000] [--index sqlite,postgresql]
        [--output benchmarks/results/lifecycle.md]

Traffic to 127.0.0.1 only. ``run()`` is the core (tests/benchmarks/test_lifecycle.py runs
it with N=5)."""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(HERE))
from loadtests import common  # noqa: E402
from tests.helpers import make_dataset, multipart, to_bytes  # noqa: E402

MR_IMAGE_STORAGE = "1.2.840.10008.5.1.4.1.1.4"
BATCH = 100
OLD = ("Before^Update", "OLD-1")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _body(name: str, pid: str) -> dict:
    return {"00100010": {"vr": "PN", "Value": [{"Alphabetic": name}]}, "00100020": {"vr": "LO", "Value": [pid]}}


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


class Server:
    """One ``serve`` process on a free port of 127.0.0.1 with its own data folder."""

    def __init__(self, data_dir: Path, env: dict | None = None):
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        data_dir.mkdir(parents=True, exist_ok=True)
        self.log = open(data_dir.parent / "server.log", "w")
        # QIDO-RS answers one page of every instance of the study (the readers' check)
        env = {**os.environ, "PYTHONPATH": str(HERE), "DICOMWEB_MAX_RESULTS": "10000", **(env or {})}
        self.proc = subprocess.Popen([sys.executable, "-m", "dicomweb_server.cli", "serve", "--port", str(self.port),
                                      "--dimse-port", "0", "--data-dir", str(data_dir)],
                                     env=env, stdout=self.log, stderr=subprocess.STDOUT, cwd=str(data_dir.parent))
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(self.base + "/studies?limit=1", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"server did not start, see {self.log.name}")
            time.sleep(0.2)

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def build_study(client: httpx.Client, n: int) -> tuple[str, int]:
    """Stores a study of ``n`` 64x64 16-bit MR instances (one series); returns its UID
    and the size of one file in bytes."""
    first = make_dataset(sop_class=MR_IMAGE_STORAGE, modality="MR", rows=64, columns=64,
                         PatientName=OLD[0], PatientID=OLD[1])
    study, series = first.StudyInstanceUID, first.SeriesInstanceUID
    size = len(to_bytes(first))
    done = 0
    while done < n:
        files = [to_bytes(first if done + i == 0 else make_dataset(
            study=study, series=series, sop_class=MR_IMAGE_STORAGE, modality="MR", rows=64, columns=64,
            PatientName=OLD[0], PatientID=OLD[1], InstanceNumber=done + i + 1)) for i in range(min(BATCH, n - done))]
        body, ctype = multipart(files)
        r = client.post("/studies", content=body, headers={"Content-Type": ctype, "Accept": "application/dicom+json"})
        assert r.status_code == 200, (r.status_code, r.text[:300])
        done += len(files)
    return study, size


def update(client: httpx.Client, study: str, name: str, pid: str) -> dict:
    t = time.perf_counter()
    r = client.post(f"/studies/{study}/$update", json=_body(name, pid),
                    headers={"Content-Type": "application/dicom+json"})
    wall = time.perf_counter() - t
    assert r.status_code == 200, (r.status_code, r.text[:300])
    doc = r.json()
    return {"instances": doc["instances"], "wall": wall, "server": doc["seconds"]}


def _values(doc: list) -> set:
    out = set()
    for inst in doc:
        name = inst.get("00100010", {}).get("Value", [{}])[0].get("Alphabetic")
        pid = inst.get("00100020", {}).get("Value", [None])[0]
        out.add((name, pid))
    return out


def readers_during_update(base: str, study: str, n: int, old: tuple, new: tuple) -> dict:
    """One client polls QIDO-RS of the study's instances while the study is updated from
    ``old`` to ``new``; every answer must hold ``n`` instances, all old or all new."""
    done_at: list[float] = []  # when the update's answer came
    seen = {"old": 0, "new": 0, "mixed": 0, "wrong_count": 0, "errors": 0, "old_after": 0}
    latency: list[float] = []
    url = f"/studies/{study}/instances?includefield=00100010&includefield=00100020&limit={n}"

    def poll():
        with httpx.Client(base_url=base, timeout=60) as c:
            while True:
                t = time.perf_counter()
                # the last answer: the first asked 0.2 s after the update was acknowledged
                last = bool(done_at) and t > done_at[0] + 0.2
                try:
                    r = c.get(url, headers={"Accept": "application/dicom+json"})
                except httpx.HTTPError:
                    seen["errors"] += 1
                    if last:
                        break
                    continue
                latency.append(time.perf_counter() - t)
                if r.status_code != 200:
                    seen["errors"] += 1
                    if last:
                        break
                    continue
                doc = r.json()
                values = _values(doc)
                if len(doc) != n:
                    seen["wrong_count"] += 1
                elif values == {old}:
                    seen["old"] += 1
                elif values == {new}:
                    seen["new"] += 1
                else:
                    seen["mixed"] += 1
                if done_at and t > done_at[0] and values != {new}:
                    seen["old_after"] += 1  # asked after the acknowledgement: must be new
                if last:
                    break

    reader = threading.Thread(target=poll)
    reader.start()
    time.sleep(0.2)  # the reader's first answers come before the update
    with httpx.Client(base_url=base, timeout=600) as c:
        result = update(c, study, *new)
    done_at.append(time.perf_counter())
    reader.join()
    return {**result, **seen, "answers": len(latency), "p50": _pct(latency, 0.5), "p99": _pct(latency, 0.99)}


def read_feed(client: httpx.Client, metadata: bool) -> dict:
    """Reads the whole change feed (v1) 100 at a time; entries/s."""
    offset, entries, calls, with_metadata = 0, 0, 0, 0
    t = time.perf_counter()
    while True:
        r = client.get("/changefeed", params={"offset": offset, "limit": 100,
                                              "includemetadata": "true" if metadata else "false"})
        assert r.status_code == 200, (r.status_code, r.text[:300])
        page = r.json()
        calls += 1
        if not page:
            break
        assert ("Metadata" in page[0]) == metadata
        entries += len(page)
        with_metadata += sum(1 for e in page if e.get("Metadata"))
        offset = page[-1]["Sequence"]
    s = time.perf_counter() - t
    return {"metadata": metadata, "entries": entries, "with_metadata": with_metadata, "requests": calls, "seconds": s, "rate": entries / s}


def run(sizes: list[int], work: Path, database_url: str | None = None) -> dict:
    """The benchmark: one fresh archive under ``work`` (SQLite index, or PostgreSQL at
    ``database_url``); returns the figures."""
    env = {"DICOMWEB_INDEX": "postgresql", "DICOMWEB_DATABASE_URL": database_url} if database_url else {}
    server = Server(work / "data", env)
    out: dict = {"index": "postgresql" if database_url else "sqlite", "sizes": {}, "file_size": None}
    try:
        with httpx.Client(base_url=server.base, timeout=600) as client:
            studies = {}
            for n in sizes:
                t = time.perf_counter()
                studies[n], out["file_size"] = build_study(client, n)
                out["sizes"][n] = {"store": time.perf_counter() - t}
            for n in sizes:
                res = update(client, studies[n], "After^Update", "NEW-1")
                assert res["instances"] == n, res
                out["sizes"][n].update(res)
            n = max(sizes)
            out["readers"] = {"n": n, **readers_during_update(server.base, studies[n], n,
                                                              ("After^Update", "NEW-1"), ("Again^Update", "NEW-2"))}
            out["feed"] = [read_feed(client, True), read_feed(client, False)]
    finally:
        server.close()
    return out


def facts() -> dict:
    """The machine (loadtests/common.py ``machine``: CPU model from /proc/cpuinfo...) and the commit."""
    m = common.machine()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True,
                            text=True).stdout.strip() or "?"
    return {"cpu": m["cpu_model"], "cores": m["nproc"], "python": m["python"], "commit": commit,
            "kernel": m["kernel"]}


def report(outs: list[dict], f: dict, load_before, load_after, started: str, total: float) -> str:
    out = outs[0]
    lines = [f"# Study `$update` and change feed read rate, {started}", "",
             f"Machine: {f['cpu']}, {f['cores']} cores (shared with other engineers), Linux {f['kernel']}, "
             f"Python {f['python']}, commit {f['commit']}.",
             f"Load average before: {' '.join(f'{x:.2f}' for x in load_before)}; "
             f"after: {' '.join(f'{x:.2f}' for x in load_after)}. Total run {total:.0f} s.",
             f"Instances: 64x64 16-bit MR made with pydicom, {out['file_size']:,} bytes each, one series per study, "
             "stored with STOW-RS (100 per request). Local files (fsyncs on); each index its own fresh "
             "archive (PostgreSQL: tests/postgres.py's throw-away server, fsync on, same machine); server with its "
             "default workers (one per core), one client.", "",
             f"    PYTHONPATH=. python benchmarks/lifecycle.py --index {','.join(o['index'] for o in outs)} "
             "--output benchmarks/results/lifecycle.md", "",
             "## `POST /studies/{uid}/$update` (PatientName + PatientID)", "",
             "| index | instances | update, HTTP round trip s | server `seconds` | instances/s | (STOW-RS of the study, s) |",
             "|---|---|---|---|---|---|"]
    for o in outs:
        for n, r in o["sizes"].items():
            lines.append(f"| {o['index']} | {n:,} | {r['wall']:.2f} | {r['server']:.2f} | {n / r['wall']:.0f} "
                         f"| {r['store']:.1f} |")
    rd = out["readers"]
    lines += ["", f"## Readers during an update of the {rd['n']:,}-instance study", "",
              "One client polls `GET /studies/{uid}/instances?includefield=00100010&includefield=00100020` "
              f"(all {rd['n']:,} instances in one answer), one request after the other, from 0.2 s before the "
              "update until an answer to a request sent 0.2 s after the update's acknowledgement; "
              "\"old after ack\": answers to requests sent after the acknowledgement that were not all new; "
              "the update (a second one, to other values) shares the 2 cores with it.", "",
              "| index | update s (server) | answers | all old | all new | mixed | wrong count | errors | old after ack "
              "| p50 ms | p99 ms |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for o in outs:
        rd = o["readers"]
        lines.append(f"| {o['index']} | {rd['wall']:.2f} ({rd['server']:.2f}) | {rd['answers']} | {rd['old']} "
                     f"| {rd['new']} | {rd['mixed']} | {rd['wrong_count']} | {rd['errors']} | {rd['old_after']} | {1000 * rd['p50']:.0f} "
                     f"| {1000 * rd['p99']:.0f} |")
    lines += ["", "## Change feed read rate (`/changefeed?offset=&limit=100`, the whole feed)", "",
              "| index | includemetadata | entries | of which with Metadata | requests | s | entries/s |",
              "|---|---|---|---|---|---|---|"]
    for o in outs:
        for fd in o["feed"]:
            lines.append(f"| {o['index']} | {str(fd['metadata']).lower()} | {fd['entries']:,} | {fd['with_metadata']:,} "
                         f"| {fd['requests']} | {fd['seconds']:.2f} | {fd['rate']:,.0f} |")
    lines += ["", "The feed holds one `create` per stored instance and one `update` per updated instance "
              "(the largest study twice). With metadata, an entry whose instance version is current carries "
              "its DICOM JSON (as WADO-RS metadata gives it); a replaced one has `Metadata: null`."]
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="100,1000,3000", help="study sizes, comma separated")
    p.add_argument("--dir", default=tempfile.gettempdir(), help="where the archive goes (the disk measured)")
    p.add_argument("--output", type=Path, help="write the markdown report here")
    p.add_argument("--index", default="sqlite", help="sqlite, postgresql or both (comma separated)")
    args = p.parse_args()
    indexes = args.index.split(",")
    sizes = [int(x) for x in args.sizes.split(",")]
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load_before = os.getloadavg()
    t = time.perf_counter()
    outs, pg = [], None
    try:
        for index in indexes:
            work = Path(tempfile.mkdtemp(prefix="bench_lifecycle_", dir=args.dir))
            try:
                if index == "postgresql":
                    from tests.postgres import PostgresServer
                    pg = pg or PostgresServer()
                    outs.append(run(sizes, work, pg.fresh_url()))
                else:
                    outs.append(run(sizes, work))
            finally:
                shutil.rmtree(work, ignore_errors=True)
    finally:
        if pg:
            pg.stop()
    text = report(outs, facts(), load_before, os.getloadavg(), started, time.perf_counter() - t)
    print(text, end="")
    if args.output:
        args.output.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
