"""``dicomweb-server pull --from AE [--query KEY=VALUE]... [STUDY]... [--resume FILE]``: pull
studies from another PACS of the peers file into this archive (dimse/pull.py), in this
process (jobs.run_inline): a progress line per study on stderr, the counts at the end.

With ``--resume FILE`` the job's checkpoint is kept in that file after each study: the same
command run again (after a kill, a power cut, a remote that went away) goes on from the
next study. Exit status: 0 every study pulled (or skipped), 1 some failed or the job
failed, 2 bad arguments.

By C-MOVE (the default) the instances arrive at this archive's DIMSE listener: ``serve``
must be running with ``--ae-title`` as the remote knows it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import orjson

KIND = "pull"


def add_parser(sub, add_settings_args: Callable[[argparse.ArgumentParser], None], settings_of, existing_archive,
               open_archive) -> None:
    p = sub.add_parser("pull", help="query/retrieve: pull studies from another PACS of the peers file (C-FIND, "
                                    "then C-MOVE to this archive's AE title, or C-GET), as a resumable job")
    p.add_argument("--from", dest="source", required=True, metavar="AE", help="the remote's AE title (peers file)")
    p.add_argument("--query", action="append", default=[], metavar="KEY=VALUE",
                   help="a study matching key of the C-FIND (repeat): PatientID=123, StudyDate=20240101-20241231, "
                        "AccessionNumber=A*, ModalitiesInStudy=CT ...")
    p.add_argument("studies", nargs="*", metavar="STUDY", help="Study Instance UIDs to pull")
    p.add_argument("--skip-complete", dest="skip_complete", action="store_true",
                   help="do not retrieve a study this archive holds with as many instances as the remote says")
    p.add_argument("--resume", type=Path, metavar="FILE",
                   help="keep the job's checkpoint in FILE: the same command again continues where it stopped")
    p.add_argument("--dimse-peers-file", dest="dimse_peers_file",
                   help="JSON/TOML peers file naming the remote (or DICOMWEB_DIMSE_PEERS_FILE)")
    p.add_argument("--ae-title", dest="ae_title", help="this archive's AE title (default DICOMWEB): the calling AE "
                                                       "title and the C-MOVE destination")
    p.add_argument("--json", action="store_true", help="the result as one JSON object")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    add_settings_args(p)
    p.set_defaults(func=lambda args: main(args, settings_of, existing_archive, open_archive))


def main(args: argparse.Namespace, settings_of, existing_archive, open_archive) -> int:
    from ..jobs import JobError, Progress, run_inline
    from .pull import RemoteUnavailable, check_params, parse_query

    settings = settings_of(args)
    try:
        params = {"from": args.source, "query": parse_query(args.query), "studies": list(args.studies),
                  "skip_complete": bool(args.skip_complete)}
        check_params(params)
    except JobError as e:
        print(f"dicomweb-server pull: {e}", file=sys.stderr)
        return 2
    if not existing_archive(settings, "pull"):
        return 2

    def progress(p: Progress) -> None:
        if args.quiet:
            return
        i = p.detail.get("instances", {})
        print(f"pull {args.source}: {p.done + p.failed + p.skipped}/{p.total} studies ({p.done} pulled, "
              f"{p.skipped} skipped, {p.failed} failed); instances {i.get('completed', 0)} completed, "
              f"{i.get('failed', 0)} failed, {i.get('warning', 0)} warning", file=sys.stderr, flush=True)

    archive = open_archive(settings, "pull")
    try:
        result, _ = run_inline(KIND, params, archive, args.resume, progress)
    except JobError as e:
        print(f"dicomweb-server pull: failed: {e}", file=sys.stderr)
        return 1
    except (RemoteUnavailable, KeyboardInterrupt) as e:
        again = f"; run the same command again to go on ({args.resume})" if args.resume else ""
        print(f"dicomweb-server pull: stopped: {e or 'interrupted'}{again}", file=sys.stderr)
        return 1
    finally:
        archive.close()
    if args.json:
        print(orjson.dumps(result).decode())
    else:
        for uid, why in result["failures"].items():
            print(f"failed {uid}: {why}")
        n = result["instances"]
        print(f"{result['pulled']} of {result['studies']} stud{'y' if result['studies'] == 1 else 'ies'} pulled from "
              f"{result['from']} by {result['method']} ({result['skipped']} skipped, {result['failed']} failed); "
              f"instances: {n['completed']} completed, {n['failed']} failed, {n['warning']} warning")
    return 1 if result["failed"] else 0
