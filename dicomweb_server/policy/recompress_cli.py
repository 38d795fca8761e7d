"""``dicomweb-server recompress``: re-encode the stored instances by the ``[[store_as]]``
rules of the routes file (policy/recompress.py), throttled, with a progress bar and a report
of the bytes saved per transfer syntax; ``--resume FILE`` continues a stopped run (the same
command and FILE again), ``--dry-run`` encodes and measures without changing anything."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import orjson


def add_parser(sub, add_settings_args: Callable[[argparse.ArgumentParser], None], func) -> None:
    rec = sub.add_parser("recompress", help="re-encode stored instances by the [[store_as]] rules of the routes "
                                            "file (lossless, verified); --dry-run measures what it would save")
    rec.add_argument("--routes", dest="routes_file", help="TOML routes file with [[store_as]] rules "
                                                          "(or DICOMWEB_ROUTES_FILE)")
    rec.add_argument("--dry-run", dest="dry_run", action="store_true",
                     help="encode and verify each instance, report the sizes, change nothing")
    rec.add_argument("--resume", metavar="FILE", type=Path,
                     help="keep the checkpoint in FILE: the same command with the same FILE continues a stopped run")
    rec.add_argument("--rate", type=float, metavar="N", help="at most N instances per second")
    rec.add_argument("--bytes-rate", dest="bytes_rate", type=float, metavar="BYTES",
                     help="at most BYTES of stored files read per second")
    rec.add_argument("--limit", type=int, metavar="N", help="stop after N instances re-encoded")
    rec.add_argument("--match", action="append", metavar="KEY=VALUE", default=[],
                     help="only the instances these QIDO-RS keys match (repeat: all of them), e.g. Modality=CT")
    rec.add_argument("--yield-seconds", dest="quiet", type=float, metavar="S",
                     help="wait until no instance was stored for S seconds before each instance (default 1; "
                          "0: never wait)")
    rec.add_argument("--json", action="store_true", help="the report as one JSON object")
    rec.add_argument("--quiet", dest="no_progress", action="store_true", help="no progress bar")
    add_settings_args(rec)
    rec.set_defaults(func=func)


def params_of(args: argparse.Namespace) -> dict:
    """The job's parameters from the command's flags (only those given: a resumed run
    compares them with the checkpoint's)."""
    match: dict = {}
    for pair in args.match:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--match {pair!r}: KEY=VALUE expected")
        match[key] = value
    p = {"match": match or None, "rate": args.rate, "bytes_rate": args.bytes_rate, "limit": args.limit,
         "quiet": args.quiet, "dry_run": args.dry_run or None}
    return {k: v for k, v in p.items() if v is not None}


def command(args: argparse.Namespace, settings, existing_archive, open_archive) -> int:
    """The command, given its settings and cli.py's archive checks."""
    return main(args, settings, open_archive) if existing_archive(settings, "recompress") else 2


def main(args: argparse.Namespace, settings, open_archive) -> int:
    from ..jobs import JobError, run_inline

    if settings.index == "memory":  # a running server's rows would keep the old sizes: 404 until it restarts
        print("dicomweb-server recompress: not with the in-memory index (--index memory): a server using this "
              "data folder keeps its own rows, and every re-encoded instance would answer 404 there until it "
              "restarts; ask that server instead: POST /admin/recompress (the same job, in its process)",
              file=sys.stderr)
        return 2
    if settings.routes_file is None:
        print("dicomweb-server recompress: --routes FILE (or DICOMWEB_ROUTES_FILE) names the [[store_as]] rules",
              file=sys.stderr)
        return 2
    try:
        params = params_of(args)
    except ValueError as e:
        print(f"dicomweb-server recompress: {e}", file=sys.stderr)
        return 2
    bar = None

    def progress(p) -> None:
        nonlocal bar
        if args.no_progress:
            return
        if bar is None:
            from tqdm import tqdm

            bar = tqdm(total=p.total, unit="instance", desc="recompress", file=sys.stderr)
        bar.total = p.total
        bar.n = p.done + p.skipped + p.failed
        d = p.detail or {}
        bar.set_postfix_str(f"re-encoded {p.done}, saved {d.get('bytes_saved', 0):,} B", refresh=False)
        bar.refresh()

    archive = open_archive(settings, "recompress")
    try:
        with quiet_pydicom():
            result, prog = run_inline("recompress", params, archive, args.resume, progress)
    except JobError as e:
        print(f"dicomweb-server recompress: {e}", file=sys.stderr)
        return 2
    finally:
        if bar is not None:
            bar.close()
        archive.close()
    if args.json:
        print(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode())
    else:
        print(summary(result))
    return 1 if result["failed"] else 0


@contextlib.contextmanager
def quiet_pydicom() -> Iterator[None]:
    """pydicom's warnings and log records silenced for the run, here and in the decode
    workers it starts (their environment): it warns about every oddity of the stored files,
    over the progress bar or through ``--quiet``; what matters is in the report (a failure
    and its reason, the instance kept as stored)."""
    saved_env, logger = os.environ.get("PYTHONWARNINGS"), logging.getLogger("pydicom")
    level = logger.level
    os.environ["PYTHONWARNINGS"] = "ignore"
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", module="pydicom")
            yield
    finally:
        logger.setLevel(level)
        if saved_env is None:
            os.environ.pop("PYTHONWARNINGS", None)
        else:
            os.environ["PYTHONWARNINGS"] = saved_env


def summary(r: dict) -> str:
    """The report as lines: per transfer syntax, then the totals."""
    verb = "would be re-encoded" if r["dry_run"] else "re-encoded"
    lines = []
    rows = [("from -> to", "instances", "bytes before", "bytes after", "saved")]
    for pair, v in sorted(r["by_syntax"].items()):
        rows.append((pair, str(v["instances"]), f"{v['bytes_before']:,}", f"{v['bytes_after']:,}",
                     f"{v['bytes_before'] - v['bytes_after']:,}"))
    if len(rows) > 1:
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        lines += ["  ".join(v.rjust(w) if i else v.ljust(w) for i, (v, w) in enumerate(zip(row, widths)))
                  for row in rows]
    lines.append(f"{r['done']} instance(s) {verb}: {r['bytes_before']:,} -> {r['bytes_after']:,} bytes "
                 f"({r['bytes_saved']:,} saved); {r['skipped']} skipped, {r['failed']} failed")
    for why, n in sorted(r["skipped_why"].items()):
        lines.append(f"  skipped {n}: {why}")
    for f in r["failures"]:
        lines.append(f"  failed {f['SOPInstanceUID']}: {f['why']}")
    if r["throttled_seconds"] or r["yielded_seconds"]:
        lines.append(f"  waited {r['throttled_seconds']:.1f} s for the rate limits, "
                     f"{r['yielded_seconds']:.1f} s for stores")
    return "\n".join(lines)
