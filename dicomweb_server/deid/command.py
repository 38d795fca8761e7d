"""The command line's front door to de-identification: ``dicomweb-server export
--deidentify PROFILE --project NAME --to DIR|s3://... [--resume FILE] [STUDY | KEY=VALUE...]``
(cli.py parses the flags; the work is the ``deidentify`` job's, deid/job.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import orjson

from ..dicom.matching import QueryError, parse_query
from ..jobs import JobError, run_inline
from . import profile
from .apply import parse_safe_private
from .job import inside_storage, params, parse_target, progress_line
from .pseudonyms import PseudonymError


def export_deidentified(args: argparse.Namespace, settings, filters: list, open_archive) -> int:
    """``export --deidentify PROFILE --project NAME --to DIR|s3://bucket/prefix [--resume FILE]
    [STUDY | KEY=VALUE...]``: the studies (one, or those a QIDO-RS study search with the
    filters finds) de-identified into the folder or S3 prefix, by the ``deidentify`` job
    (deid/job.py) run in this process (jobs.run_inline; with ``--resume FILE`` the same
    command continues where a killed run stopped); a progress line on stderr, the JSON
    report on stdout; exit 0 when every instance was exported, 1 when some were refused or
    failed, 2 for a bad command line."""
    try:
        profile.parse(args.deidentify, args.option or [])
        for t in args.safe_private or []:
            try:
                parse_safe_private(t)
            except ValueError as e:
                raise ValueError(f"--safe-private: {e}") from None
    except ValueError as e:
        print(f"dicomweb-server export: {'' if str(e).startswith('--') else '--deidentify: '}{e}", file=sys.stderr)
        return 2
    if not args.project:
        print("dicomweb-server export: --deidentify needs --project NAME (its secret and pseudonyms)",
              file=sys.stderr)
        return 2
    if args.study is not None and filters:
        print("dicomweb-server export: give a STUDY or KEY=VALUE filters, not both", file=sys.stderr)
        return 2
    try:
        target = parse_target(args.to)
        if next(iter(target)) not in ("folder", "s3"):
            raise ValueError("a folder or s3://bucket/prefix (labels and destinations: POST /$deidentify)")
        if "s3" in target and inside_storage(target["s3"], settings.storage):
            raise ValueError(f"{args.to} is inside the archive's own storage ({settings.storage})")
    except ValueError as e:
        print(f"dicomweb-server export: --to: {e}", file=sys.stderr)
        return 2
    if "folder" in target:
        to = Path(target["folder"])
        if to.exists() and not to.is_dir():
            print(f"dicomweb-server export: --to {to} is not a folder", file=sys.stderr)
            return 2
        target = {"folder": str(to.resolve())}
    try:
        p = params(deidentify=args.deidentify, options=args.option or [], project=args.project, target=target,
                   studies=[args.study] if args.study is not None else None,
                   query=None if args.study is not None else [tuple(f) for f in filters],
                   allow_burned_in=args.allow_burned_in, safe_private=args.safe_private or [])
    except ValueError as e:
        print(f"dicomweb-server export: --deidentify: {e}", file=sys.stderr)
        return 2
    if p["query"] is not None:
        try:
            parse_query("study", [(k, v) for k, v in p["query"]])
        except QueryError as e:
            print(f"dicomweb-server export: {e}", file=sys.stderr)
            return 2
    settings = settings.model_copy(update={"routes_file": None})  # an export routes nothing
    archive = open_archive(settings)
    try:
        pseudonyms = archive.pseudonyms
        pseudonyms.secret(args.project)  # the command makes the project (a download never does)
        if args.pseudonyms:
            try:
                n = pseudonyms.load_csv(args.project, Path(args.pseudonyms).read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, PseudonymError) as e:
                print(f"dicomweb-server export: --pseudonyms {args.pseudonyms}: {e}", file=sys.stderr)
                return 2
            print(f"{n} pseudonym(s) added to project {args.project!r}", file=sys.stderr)
        resume = Path(args.resume) if args.resume else None
        try:
            report, _ = run_inline("deidentify", p, archive, resume, progress_line(args.quiet))
        except JobError as e:
            print(f"dicomweb-server export: {e}", file=sys.stderr)
            return 2
    finally:
        archive.close()
    print(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode())
    return 0 if report["refused"] == 0 and report["failed"] == 0 else 1
