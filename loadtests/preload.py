"""Preload the LOAD-03 data set into one or more DICOMweb servers through STOW-RS.

    python -m loadtests.preload --manifest M.json --host http://127.0.0.1:8080 [--host URL2 ...]

The images are made again from the manifest's seed (nothing is read from disk;
each pixel-data SHA-256 is checked against the manifest), study by study, and sent
with the project's client (:class:`dicomweb_client.DICOMwebClient`,
``store_instances``), up to ``--batch`` instances per request. What is already
there is skipped: QIDO-RS first asks each server for every study's
NumberOfStudyRelatedInstances (and, for a partly stored study, its instances).
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from . import dataset


class PreloadError(RuntimeError):
    pass


def _count(client, study_uid: str) -> int:
    found = client.search_for_studies(search_filters={"StudyInstanceUID": study_uid},
                                      fields=["NumberOfStudyRelatedInstances"])
    if not found:
        return 0
    v = found[0].get("00201208", {}).get("Value", [0])
    return int(v[0]) if v else 0


def _present_sops(client, study_uid: str) -> set[str]:
    found = client.search_for_instances(study_instance_uid=study_uid, fields=["SOPInstanceUID"],
                                        get_remaining=True)
    return {r["00080018"]["Value"][0] for r in found if "00080018" in r}


def missing(client, manifest: dict) -> dict[str, set[str] | None]:
    """{study UID: None (all missing) or the set of SOP UIDs missing}; complete studies left out."""
    by_study: dict[str, list[str]] = {}
    for i in manifest["instances"]:
        by_study.setdefault(i["study"], []).append(i["sop"])
    out: dict[str, set[str] | None] = {}
    for st in manifest["studies"]:
        n = _count(client, st["uid"])
        if n == st["instances"]:
            continue
        if n == 0:
            out[st["uid"]] = None
        else:
            out[st["uid"]] = set(by_study[st["uid"]]) - _present_sops(client, st["uid"])
            if not out[st["uid"]]:
                del out[st["uid"]]
    return out


def preload(manifest: dict, hosts: list[str], batch: int = 25, progress: bool = True,
            timeout: float = 120.0) -> dict[str, int]:
    """Store what each host lacks; returns {host: instances sent}."""
    from tqdm import tqdm

    from dicomweb_client import DICOMwebClient

    spec = dataset.spec_of(manifest)
    expected = {i["sop"]: i["sha256"] for i in manifest["instances"]}
    clients = {h: DICOMwebClient(h, timeout=timeout) for h in hosts}
    todo = {h: missing(c, manifest) for h, c in clients.items()}
    sent = {h: 0 for h in hosts}
    studies_needed = set().union(*[set(t) for t in todo.values()]) if todo else set()
    if not studies_needed:
        if progress:
            print(f"preload: everything already stored on {', '.join(hosts)}", file=sys.stderr)
        return sent
    total = sum(
        sum(st["instances"] if t[st["uid"]] is None else len(t[st["uid"]])
            for st in manifest["studies"] if st["uid"] in t)
        for t in todo.values())
    pools = {h: ThreadPoolExecutor(1, thread_name_prefix="stow") for h in hosts}
    pending: dict[str, list[Future]] = {h: [] for h in hosts}
    bar = tqdm(total=total, unit="img", desc="preload (STOW-RS)", disable=not progress, file=sys.stderr)

    def store(host: str, items: list[tuple[str, bytes]]) -> int:
        result = clients[host].store_instances([data for _, data in items])
        if result.failed:
            reasons = "; ".join(f"{f.sop_instance_uid}: {f.failure_reason}" for f in result.failed[:5])
            raise PreloadError(f"{host}: {len(result.failed)} instance(s) not stored: {reasons}")
        got = {r.sop_instance_uid for r in result.referenced}
        lost = [sop for sop, _ in items if sop not in got]
        if lost:
            raise PreloadError(f"{host}: answer does not reference {len(lost)} instance(s), e.g. {lost[0]}")
        bar.update(len(items))
        return len(items)

    def submit(host: str, items: list[tuple[str, bytes]]) -> None:
        q = pending[host]
        while len(q) >= 2:  # bound memory: at most two batches in flight per host
            sent[host] += q.pop(0).result()
        q.append(pools[host].submit(store, host, list(items)))

    try:
        buffers: dict[str, list[tuple[str, bytes]]] = {h: [] for h in hosts}
        for inst, data in dataset.iter_instances(spec, only=studies_needed):
            sha = hashlib.sha256(inst.pixels.data).hexdigest()
            if expected.get(inst.sop_uid) != sha:
                raise PreloadError(f"instance {inst.sop_uid} made from the seed does not match the manifest "
                                   "(different numpy/pydicom?): make the manifest again")
            for h in hosts:
                want = todo[h].get(inst.study.uid, ())
                if want is None or inst.sop_uid in want:
                    buffers[h].append((inst.sop_uid, data))  # type: ignore[arg-type]
                    if len(buffers[h]) >= batch:
                        submit(h, buffers[h])
                        buffers[h] = []
        for h in hosts:
            if buffers[h]:
                submit(h, buffers[h])
            for f in pending[h]:
                sent[h] += f.result()
            pending[h].clear()
    finally:
        bar.close()
        for p in pools.values():
            p.shutdown(wait=True, cancel_futures=True)
        for c in clients.values():
            c.close()
    return sent


def verify(manifest: dict, host: str) -> list[str]:
    """Problems found by asking ``host`` for each study's instance count (empty: complete)."""
    from dicomweb_client import DICOMwebClient

    with DICOMwebClient(host) as c:
        return [f"{st['uid']}: {n} of {st['instances']} instances" for st in manifest["studies"]
                if (n := _count(c, st["uid"])) != st["instances"]]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtests.preload", description=__doc__.split("\n\n")[0])
    p.add_argument("--manifest", type=Path, help="manifest (made if missing; default from the sizes)")
    dataset.add_spec_args(p)
    p.add_argument("--host", action="append", required=True, help="DICOMweb root URL (repeat for several)")
    p.add_argument("--batch", type=int, default=25, help="instances per STOW-RS request (default %(default)s)")
    p.add_argument("--quiet", action="store_true")
    a = p.parse_args(argv)
    spec = dataset.spec_from_args(a)
    path = a.manifest or dataset.default_manifest_path(spec)
    manifest = dataset.load_manifest(path) if a.manifest and path.exists() else \
        dataset.ensure_manifest(path, spec, progress=not a.quiet)
    t0 = time.monotonic()
    sent = preload(manifest, a.host, batch=a.batch, progress=not a.quiet)
    for h in a.host:
        problems = verify(manifest, h)
        print(f"{h}: sent {sent[h]} instance(s); "
              + ("complete" if not problems else f"{len(problems)} studies incomplete, e.g. {problems[0]}"))
        if problems:
            return 1
    print(f"preload took {time.monotonic() - t0:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
