"""The command line's front door to de-identification: ``dicomweb-server export
--deidentify PROFILE --project NAME --to DIR [STUDY | KEY=VALUE...]`` (cli.py parses the
flags; the work is deid/export.py's)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import orjson

from ..dicom.matching import QueryError
from . import profile
from .apply import parse_safe_private
from .export import Deidentifier, Spec, export_folder, select_studies
from .pseudonyms import PseudonymError, open_pseudonyms


def export_deidentified(args: argparse.Namespace, settings, filters: list, open_archive) -> int:
    """``export --deidentify PROFILE --project NAME --to DIR [STUDY | KEY=VALUE...]``: the
    studies (one, or those a QIDO-RS study search with the filters finds) de-identified
    into the folder DIR (deid/export.py); a progress line on stderr, the JSON report on
    stdout; exit 0 when every instance was exported, 1 when some were refused or failed."""
    try:
        options = profile.parse(args.deidentify, args.option or [])
    except ValueError as e:
        print(f"dicomweb-server export: --deidentify: {e}", file=sys.stderr)
        return 2
    if not args.project:
        print("dicomweb-server export: --deidentify needs --project NAME (its secret and pseudonyms)",
              file=sys.stderr)
        return 2
    try:
        safe = frozenset(parse_safe_private(t) for t in args.safe_private or [])
    except ValueError as e:
        print(f"dicomweb-server export: --safe-private: {e}", file=sys.stderr)
        return 2
    to = Path(args.to)
    if to.exists() and not to.is_dir():
        print(f"dicomweb-server export: --to {to} is not a folder", file=sys.stderr)
        return 2
    settings = settings.model_copy(update={"routes_file": None})  # a folder export routes nothing
    archive = open_archive(settings)
    pseudonyms = open_pseudonyms(settings)
    try:
        if args.pseudonyms:
            try:
                n = pseudonyms.load_csv(args.project, Path(args.pseudonyms).read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, PseudonymError) as e:
                print(f"dicomweb-server export: --pseudonyms {args.pseudonyms}: {e}", file=sys.stderr)
                return 2
            print(f"{n} pseudonym(s) added to project {args.project!r}", file=sys.stderr)
        if args.study is not None:
            if filters:
                print("dicomweb-server export: give a STUDY or KEY=VALUE filters, not both", file=sys.stderr)
                return 2
            studies = [args.study]
        else:
            try:
                studies = select_studies(archive.index, filters)
            except QueryError as e:
                print(f"dicomweb-server export: {e}", file=sys.stderr)
                return 2
        deid = Deidentifier(Spec(options, args.project, allow_burned_in=args.allow_burned_in,
                                 safe_private=safe), pseudonyms)

        def progress(done: int, total: int) -> None:
            if not args.quiet and (done == total or done % 10 == 0):
                print(f"\rde-identified {done}/{total} instance(s)", end="\n" if done == total else "",
                      file=sys.stderr, flush=True)

        to.mkdir(parents=True, exist_ok=True)
        report = export_folder(archive, studies, deid, to, progress)
    finally:
        pseudonyms.close()
        archive.close()
    print(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode())
    return 0 if report["refused"] == 0 and report["failed"] == 0 else 1
