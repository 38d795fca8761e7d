"""The command line's routing commands: ``dicomweb-server queue`` (the forwards owed,
delivered and failed per destination; ``--retry-failed``) and ``dicomweb-server export``
(a study, series or instance to a destination of the routes file; with ``--deidentify``,
de-identified copies into a folder or an S3 prefix: deid/command.py). cli.py adds them
with :func:`add_parsers`, giving the helpers every command shares."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path


def add_parsers(sub, add_settings_args: Callable[[argparse.ArgumentParser], None], settings_of, existing_archive,
                open_archive) -> None:
    """The ``queue`` and ``export`` commands, on cli.py's subparsers."""
    from ..deid.profile import OPTION_NAMES

    que = sub.add_parser("queue", help="routing: forwards owed, delivered and failed per destination")
    que.add_argument("--retry-failed", dest="retry_failed", nargs="?", const="", metavar="DESTINATION",
                     help="put dead letters (of one destination, or all) back to pending first")
    que.add_argument("--json", action="store_true", help="JSON, as GET /admin/queue")
    add_settings_args(que)
    que.set_defaults(func=partial(_queue, settings_of=settings_of, existing_archive=existing_archive))

    exp = sub.add_parser("export", help="routing: send a study, series or instance to a destination; with "
                                        "--deidentify: de-identified copies into a folder (docs/research-export.md)")
    exp.add_argument("--to", required=True, help="destination name from the routes file (with --deidentify: "
                                                 "a folder or s3://bucket/prefix)")
    exp.add_argument("--routes", dest="routes_file", help="TOML routes file (or DICOMWEB_ROUTES_FILE)")
    exp.add_argument("targets", nargs="*", metavar="STUDY [SERIES [SOP]] | KEY=VALUE",
                     help="the UIDs to export; with --deidentify, instead QIDO-RS study matching keys "
                          "(PatientID=123 StudyDate=20240101-20241231 ModalitiesInStudy=CT ...)")
    exp.add_argument("--deidentify", metavar="PROFILE",
                     help="de-identify by PS3.15 Annex E: 'basic', options after commas "
                          "(basic,retain_modified_dates,clean_descriptors)")
    exp.add_argument("--option", action="append", metavar="NAME",
                     help="a profile option (repeat): " + ", ".join(OPTION_NAMES))
    exp.add_argument("--project", help="--deidentify: the project whose secret and pseudonyms are used")
    exp.add_argument("--pseudonyms", metavar="CSV", help="--deidentify: PatientID,pseudonym rows added to the "
                                                         "project's table first")
    exp.add_argument("--allow-burned-in", dest="allow_burned_in", action="store_true",
                     help="--deidentify: export instances with burned-in annotation too (refused by default)")
    exp.add_argument("--safe-private", dest="safe_private", action="append", metavar="CREATOR:gggg:ee",
                     help="--deidentify with retain_safe_private: a private element to keep (repeat)")
    exp.add_argument("--quiet", action="store_true", help="--deidentify: no progress line")
    exp.add_argument("--resume", metavar="FILE", help="--deidentify: the job's checkpoint, kept in FILE; the same "
                                                      "command with the same FILE continues a killed run")
    add_settings_args(exp)
    exp.set_defaults(func=partial(_export, settings_of=settings_of, existing_archive=existing_archive,
                                     open_archive=open_archive))


def _queue(args: argparse.Namespace, settings_of, existing_archive) -> int:
    from . import open_outbox, outbox_path
    from ..store.commit import GroupCommitter

    settings = settings_of(args)
    if not existing_archive(settings, "queue"):
        return 2
    if settings.index != "postgresql" and not outbox_path(Path(settings.data_dir), settings.index).exists():
        print(f"dicomweb-server queue: no outbox in {Path(settings.data_dir).resolve()}", file=sys.stderr)
        return 1
    # the index writer lock (not the index): serialise with a running server's commits (SQLite files)
    outbox = open_outbox(settings, GroupCommitter(None, Path(settings.data_dir) / "index.lock").writer)  # type: ignore[arg-type]
    try:
        if args.retry_failed is not None:
            n = outbox.retry_failed(args.retry_failed or None)
            print(f"{n} failed forward(s) back to pending", file=sys.stderr)
        stats = outbox.stats()
    finally:
        outbox.close()
    if args.json:
        import orjson

        print(orjson.dumps({"destinations": stats}, option=orjson.OPT_INDENT_2).decode())
        return 0
    cols = ("pending", "in_flight", "delivered", "failed", "oldest_pending_age", "last_error")
    rows = [("destination",) + cols] + [
        (d,) + tuple("" if s[c] is None else f"{s[c]:.0f} s" if c == "oldest_pending_age" else str(s[c])[:80]
                     for c in cols) for d, s in stats.items()]
    widths = [max(len(r[i]) for r in rows) for i in range(len(cols) + 1)]
    for r in rows:
        print("  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip())
    return 0


def _export(args: argparse.Namespace, settings_of, existing_archive, open_archive) -> int:
    filters = [tuple(t.split("=", 1)) for t in args.targets if "=" in t]
    uids = [t for t in args.targets if "=" not in t]
    if len(uids) > 3:
        print("dicomweb-server export: at most STUDY SERIES SOP", file=sys.stderr)
        return 2
    args.study, args.series, args.sop = (uids + [None, None, None])[:3]
    settings = settings_of(args)
    if not existing_archive(settings, "export"):
        return 2
    if args.deidentify is not None:
        from ..deid.command import export_deidentified

        return export_deidentified(args, settings, filters, lambda s: open_archive(s, "export"))
    if filters or args.study is None:
        print("dicomweb-server export: a destination export takes STUDY [SERIES [SOP]] (QIDO-RS filters only "
              "with --deidentify)", file=sys.stderr)
        return 2
    if settings.routes_file is None:
        print("dicomweb-server export: --routes FILE (or DICOMWEB_ROUTES_FILE) names the destinations",
              file=sys.stderr)
        return 2
    archive = open_archive(settings, "export")
    try:
        routing = archive.routing
        assert routing is not None
        if args.to not in routing.routes.destinations:
            print(f"dicomweb-server export: no destination {args.to!r}; configured: "
                  + ", ".join(routing.routes.destinations), file=sys.stderr)
            return 2
        if routing.routes.destinations[args.to].webhook is not None:
            print(f"dicomweb-server export: {args.to!r} is a webhook: it is told of changes, "
                  "no instances are exported to it", file=sys.stderr)
            return 2
        found = [i for i in archive.index.instances(args.study, args.series) if args.sop in (None, i.sop_uid)]
        if not found:
            print("dicomweb-server export: nothing stored under those UIDs", file=sys.stderr)
            return 1
        n = routing.export(args.to, found)
    finally:
        archive.close()
    print(f"{n} instance(s) queued for {args.to} (of {len(found)}; a running server delivers them)")
    return 0
