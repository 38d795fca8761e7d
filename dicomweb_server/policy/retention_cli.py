"""``dicomweb-server retention [--dry-run] [--json]``: one run of the retention policy
(policy/retention.py) on a stopped or running archive, listing each study it removes (or,
with ``--dry-run``, would remove): StudyInstanceUID, StudyDate, the latest arrival, bytes,
the rule, the action and the reason. Audited (``--audit-log``) like the server's runs."""

from __future__ import annotations

import argparse
import getpass
import sys
from collections.abc import Callable

import orjson


def add_parser(sub, add_settings_args: Callable[[argparse.ArgumentParser], None], func) -> None:
    ret = sub.add_parser("retention", help="apply the retention policy (--retention FILE): delete or reject the "
                                           "studies its rules and quota name; --dry-run lists them")
    ret.add_argument("--retention", dest="retention_file", help="TOML retention policy (or DICOMWEB_RETENTION_FILE)")
    ret.add_argument("--routes", dest="routes_file", help="TOML routes file (or DICOMWEB_ROUTES_FILE): needed by "
                                                          "rules with when_delivered, and to tell the webhooks")
    ret.add_argument("--dry-run", dest="dry_run", action="store_true", help="list what would go; change nothing")
    ret.add_argument("--json", action="store_true", help="one JSON object: the studies and the totals")
    ret.add_argument("--audit-log", dest="audit_log", help="append the run as one JSON line to this file")
    add_settings_args(ret)
    ret.set_defaults(func=func)


def main(args: argparse.Namespace, settings, open_archive) -> int:
    from .retention import PolicyError, load_policy, run

    if settings.retention_file is None:
        print("dicomweb-server retention: --retention FILE (or DICOMWEB_RETENTION_FILE) names the policy",
              file=sys.stderr)
        return 2
    try:
        policy = load_policy(settings.retention_file)
    except PolicyError as e:
        print(f"dicomweb-server retention: --retention: {e}", file=sys.stderr)
        return 2
    if settings.audit_log is not None:
        from ..access.audit import configure_audit_file

        configure_audit_file(settings.audit_log)
    archive = open_archive(settings, "retention")
    try:
        report = run(archive, policy, dry_run=args.dry_run, user=f"{getpass.getuser()} (command line)")
    finally:
        archive.close()
    items = report.plan.removals if report.dry_run else report.done
    if args.json:
        print(orjson.dumps({"dry_run": report.dry_run, "stored_bytes": report.plan.stored_bytes,
                            "bytes": sum(r.size for r in items), "studies": [r.as_dict() for r in items],
                            "skipped": [{"study": r.study_uid, "why": why} for r, why in report.skipped]},
                           option=orjson.OPT_INDENT_2).decode())
        return 0
    if items:
        rows = [("study", "date", "received", "bytes", "action", "rule", "reason")] + [
            (r.study_uid, r.study_date or "", r.as_dict()["received"], str(r.size), r.action, r.rule, r.reason)
            for r in items]
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        for row in rows:
            print("  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip())
    for r, why in report.skipped:
        print(f"kept {r.study_uid}: {why}")
    print(report.summary())
    return 0
