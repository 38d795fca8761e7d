"""``dicomweb`` command line: search, retrieve and store against a DICOMweb service.

Examples::

    dicomweb search http://127.0.0.1:8080 --filter PatientID=P1          (a table of studies)
    dicomweb search http://127.0.0.1:8080/studies/1.2.3/series           (a resource URL: its level and UIDs)
    dicomweb search http://127.0.0.1:8080 --level series --study 1.2.3 --limit 10
    dicomweb search http://127.0.0.1:8080 --json --field StudyDescription   (DICOM JSON)
    dicomweb retrieve http://127.0.0.1:8080 --study 1.2.3 --out ./study
    dicomweb store http://127.0.0.1:8080 a.dcm b.dcm some/folder/

Authentication: ``--token`` (or the ``DICOMWEB_TOKEN`` environment variable)
for a bearer token, ``--user name:password`` for HTTP Basic.

Exit status: 0 success, 1 error, 2 partial STOW failure.
"""
from __future__ import annotations

import argparse
import io
import os
import sys
from pathlib import Path
from typing import Iterator, Sequence

import orjson

from . import tables
from .client import DICOMwebClient
from .errors import DICOMwebError, StoreError
from .urls import split_resource_url

__all__ = ["main", "build_parser"]


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), value


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser of ``dicomweb``."""
    parser = argparse.ArgumentParser(prog="dicomweb", description="DICOMweb (PS3.18) command line client")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("url", help="service root, e.g. http://127.0.0.1:8080, or a resource URL under it, "
                                    "e.g. http://127.0.0.1:8080/studies/1.2.3/series (its UIDs and level are used)")
    common.add_argument("--token", default=os.environ.get("DICOMWEB_TOKEN"), help="bearer token")
    common.add_argument("--user", help="HTTP Basic credentials as NAME:PASSWORD")
    common.add_argument("--timeout", type=float, default=60.0, help="seconds (default 60)")
    common.add_argument("--header", action="append", default=[], metavar="NAME:VALUE", help="extra request header")
    sub = parser.add_subparsers(dest="command", required=True)

    s = sub.add_parser("search", parents=[common], help="QIDO-RS search; prints a table (--json: DICOM JSON)")
    s.add_argument("--level", choices=("studies", "series", "instances"), help="default: the URL's, else studies")
    s.add_argument("--study", help="restrict to a study (series/instances level)")
    s.add_argument("--series", help="restrict to a series (instances level)")
    s.add_argument("--filter", action="append", type=_key_value, default=[], metavar="KEY=VALUE")
    s.add_argument("--field", action="append", default=[], metavar="X", help="includefield (repeatable)")
    s.add_argument("--limit", type=int)
    s.add_argument("--offset", type=int)
    s.add_argument("--fuzzy", action="store_true", help="fuzzymatching=true")
    s.add_argument("--all", action="store_true", help="follow pages until every result is fetched")
    s.add_argument("--json", action="store_true", help="print the server's DICOM JSON instead of a table")

    r = sub.add_parser("retrieve", parents=[common], help="WADO-RS retrieve; writes .dcm files")
    r.add_argument("--study", help="required unless the URL names a study")
    r.add_argument("--series")
    r.add_argument("--instance")
    r.add_argument("--out", required=True, type=Path, help="output directory (created)")
    r.add_argument(
        "--transfer-syntax",
        help="transfer syntax UID to ask for (default: as stored, else Explicit VR Little Endian)",
    )

    st = sub.add_parser("store", parents=[common], help="STOW-RS store; prints the result")
    st.add_argument("files", nargs="+", type=Path, help="DICOM files or folders (searched recursively)")
    st.add_argument("--study", help="POST to /studies/{study}")
    return parser


def _client(args: argparse.Namespace) -> DICOMwebClient:
    headers = {}
    for h in args.header:
        name, sep, value = h.partition(":")
        if not sep:
            raise SystemExit(f"dicomweb: --header expects NAME:VALUE, got {h!r}")
        headers[name.strip()] = value.strip()
    auth = None
    if args.user:
        name, sep, password = args.user.partition(":")
        auth = (name, password)
    return DICOMwebClient(
        args.url,
        token=args.token if not auth else None,
        auth=auth,
        timeout=args.timeout,
        headers=headers,
    )


def _print_json(obj: object) -> None:
    sys.stdout.write(orjson.dumps(obj, option=orjson.OPT_INDENT_2).decode() + "\n")
    sys.stdout.flush()


def _expand(paths: Sequence[Path]) -> Iterator[Path]:
    for p in paths:
        if p.is_dir():
            for f in sorted(p.rglob("*")):
                if f.is_file() and not f.name.startswith("."):
                    yield f
        else:
            yield p


def _sop_instance_uid(data: bytes) -> str | None:
    from pydicom import dcmread

    try:
        ds = dcmread(io.BytesIO(data), stop_before_pixels=True, specific_tags=["SOPInstanceUID"], force=True)
        return str(ds.get("SOPInstanceUID", "")) or None
    except Exception:
        return None


def _safe_name(uid: str) -> str:
    return "".join(c for c in uid if c.isalnum() or c in ".-_") or "instance"


def _search(client: DICOMwebClient, args: argparse.Namespace) -> int:
    fields = list(args.field)
    if not args.json:  # the table's columns, besides what servers return by default
        fields += [f for f in tables.INCLUDE_FIELDS[args.level] if f not in fields]
    common = dict(
        fuzzymatching=True if args.fuzzy else None,
        limit=args.limit,
        offset=args.offset,
        fields=fields or None,
        search_filters=dict(args.filter) or None,
        get_remaining=args.all,
    )
    if args.level == "studies":
        results = client.search_for_studies(**common)
    elif args.level == "series":
        results = client.search_for_series(study_instance_uid=args.study, **common)
    else:
        results = client.search_for_instances(
            study_instance_uid=args.study, series_instance_uid=args.series, **common
        )
    if args.json:
        _print_json(results)
    else:
        sys.stdout.write(tables.format_table(results, args.level, [f for f in args.field if f != "all"]))
    return 0


def _retrieve(client: DICOMwebClient, args: argparse.Namespace) -> int:
    if args.instance and not args.series:
        raise SystemExit("dicomweb: --instance needs --series")
    # no --transfer-syntax: the client's defaults, with their fallback (dicomweb_client.negotiation)
    media_types = (("application/dicom", args.transfer_syntax),) if args.transfer_syntax else None
    args.out.mkdir(parents=True, exist_ok=True)
    if args.instance:
        items: Iterator[bytes] = iter(
            [client.retrieve_instance(args.study, args.series, args.instance, media_types, raw=True)]
        )
    elif args.series:
        items = client.iter_series(args.study, args.series, media_types, raw=True)
    else:
        items = client.iter_study(args.study, media_types, raw=True)
    written = []
    for n, data in enumerate(items, 1):
        uid = _sop_instance_uid(data) or f"instance-{n:05d}"
        path = args.out / f"{_safe_name(uid)}.dcm"
        tmp = path.with_suffix(".dcm.part")
        tmp.write_bytes(data)
        os.replace(tmp, path)
        written.append(str(path))
    _print_json({"written": len(written), "files": written})
    return 0


def _store(client: DICOMwebClient, args: argparse.Namespace) -> int:
    files = list(_expand(args.files))
    if not files:
        raise SystemExit("dicomweb: no files to store")
    try:
        result = client.store_instances([str(f) for f in files], study_instance_uid=args.study)
    except StoreError as exc:
        _print_json(exc.result.summary())
        print(f"dicomweb: {exc}", file=sys.stderr)
        return 1
    _print_json(result.summary())
    return 0 if result.ok else 2


def _resolve_url(args: argparse.Namespace) -> None:
    """A resource URL (``.../studies``, ``.../studies/{study}/series``...) as the service
    root plus the options it stands for (:func:`urls.split_resource_url`); options given
    as well must agree with it."""
    root, found = split_resource_url(args.url)
    args.url = root
    for key in ("study", "series", "instance", "level"):
        value = found.get(key)
        if value is None or not hasattr(args, key):
            continue
        given = getattr(args, key)
        if given not in (None, value):
            raise SystemExit(f"dicomweb: the URL names {key} {value}, but --{key} {given} was given")
        setattr(args, key, value)
    if args.command == "search" and args.level is None:
        args.level = "studies"
    if args.command == "retrieve" and not args.study:
        raise SystemExit("dicomweb: retrieve needs --study (or the URL of a study, series or instance)")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``dicomweb`` console script; returns the exit status."""
    args = build_parser().parse_args(argv)
    _resolve_url(args)
    try:
        with _client(args) as client:
            if args.command == "search":
                return _search(client, args)
            if args.command == "retrieve":
                return _retrieve(client, args)
            return _store(client, args)
    except (DICOMwebError, ValueError, OSError) as exc:
        print(f"dicomweb: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
