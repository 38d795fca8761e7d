"""``dicomweb-server``: run the archive, import folders of files, check the data.

    dicomweb-server [serve] [--host H] [--port P] [--data-dir D] [--index sqlite|memory] [--workers N]
    dicomweb-server import [--samples] [--routes FILE] [--report FILE] [--verbose] PATH...
                                        (exit 0: all stored, 1: some refused, 2: bad arguments)
    dicomweb-server check [--repair] [--grace SECONDS]
    dicomweb-server queue [--retry-failed] [--json]       (routing: forwards owed per destination; routing/commands.py)
    dicomweb-server export --routes FILE --to DEST STUDY [SERIES [SOP]]
    dicomweb-server pull --from AE [--query KEY=VALUE]... [STUDY]... [--resume FILE]
    dicomweb-server migrate --database-url postgresql://user@host:port/db
    dicomweb-server --help | --version

Every serve flag is also a ``DICOMWEB_*`` environment variable (see settings.py);
flags win over the environment.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

# glibc returns large buffers to the OS after each request by default; on 0.5-1 MB
# DICOM bodies the page faults cost more than the work.
# Two arenas bound what the allocator keeps across the worker threads.
_MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "67108864", "MALLOC_TRIM_THRESHOLD_": "268435456", "MALLOC_ARENA_MAX": "2"}


def _add_settings_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data-dir", help="archive folder (default ./data; env DICOMWEB_DATA_DIR)")
    p.add_argument("--index", choices=["sqlite", "memory", "postgresql"], help="metadata index (default sqlite)")
    p.add_argument("--database-url", dest="database_url",
                   help="PostgreSQL index: postgresql://user@host:port/db (env DICOMWEB_DATABASE_URL)")
    p.add_argument("--storage", help="s3://bucket/prefix: keep instances in S3-compatible object storage "
                                     "(default: the data folder's blobs/; env DICOMWEB_STORAGE)")
    p.add_argument("--s3-endpoint-url", dest="s3_endpoint_url",
                   help="S3 endpoint, e.g. http://minio:9000 (env DICOMWEB_S3_ENDPOINT_URL; credentials and "
                        "region from AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_DEFAULT_REGION)")


def _settings(args: argparse.Namespace):
    """The settings of the command line and environment; exit 2 with one line per bad
    setting (not a traceback) when any is invalid."""
    import pydantic
    import pydantic_settings

    from .settings import Settings, error_lines, settings_error_line

    overrides = {k: v for k, v in vars(args).items()
                 if k in Settings.model_fields and v is not None}
    try:
        return Settings(**overrides)
    except pydantic.ValidationError as e:
        for line in error_lines(e):  # the setting, its variable, what was given and what is allowed
            print(f"dicomweb-server: {line}", file=sys.stderr)
        raise SystemExit(2) from None
    except pydantic_settings.SettingsError as e:  # a list or mapping variable that is not JSON
        print(f"dicomweb-server: {settings_error_line(e)}", file=sys.stderr)
        raise SystemExit(2) from None


def _migrate(args: argparse.Namespace) -> int:
    """Create or migrate the PostgreSQL schema (store/postgresql.py) and say what was done."""
    import psycopg

    from .store.postgresql import DatabaseRefused, check_durable, migrate

    url = args.database_url or os.environ.get("DICOMWEB_DATABASE_URL")
    if not url:
        print("dicomweb-server migrate: give --database-url (or DICOMWEB_DATABASE_URL)", file=sys.stderr)
        return 2
    try:
        with psycopg.connect(url, autocommit=True) as con:
            check_durable(con)
            before, after = migrate(con)
    except (psycopg.Error, DatabaseRefused) as e:
        print(f"dicomweb-server migrate: {e}", file=sys.stderr)
        return 1
    print(f"schema version {after}" + (" (already current)" if before == after else f" (was {before})"))
    return 0


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from .api.limits import raise_open_files_limit

    settings = _settings(args)
    why, credentials = _credential_files(settings)  # each worker reads them: a bad one killed every worker
    if why is not None:
        print(f"dicomweb-server: {why}", file=sys.stderr)
        return 2
    if not _is_loopback(settings.host) and not credentials and not settings.insecure:
        # an empty keys file is no authentication: it used to pass this check and serve anyone
        print(f"dicomweb-server: refusing to listen on {settings.host} without authentication: configure "
              "API keys (--api-keys-file or DICOMWEB_API_KEYS), OIDC (--oidc-jwks-url) or basic users "
              "(--basic-users-file), or pass --insecure (DICOMWEB_INSECURE=true)"
              + ("; the files given hold no key or user" if settings.auth_configured() else ""),
              file=sys.stderr)
        return 2
    if settings.index == "memory" and args.workers not in (None, 1):
        print("dicomweb-server: the in-memory index lives in one process; "
              "use --workers 1 or --index sqlite", file=sys.stderr)
        return 2
    why = _data_dir_problem(Path(settings.data_dir))  # a bad folder or a taken port: nothing created
    if why is not None:
        print(f"dicomweb-server: --data-dir {settings.data_dir}: {why}", file=sys.stderr)
        return 2
    taken = _port_taken(settings.host, settings.port)
    if taken:  # uvicorn would only log "[Errno 98] Address already in use", naming no port
        print(f"dicomweb-server: cannot listen on {settings.host}:{settings.port}: {taken} "
              "(another program on that port? start with --port PORT)", file=sys.stderr)
        return 2
    if settings.viewer:  # fetch the OHIF viewer with npm before the workers start (viewer.py)
        from .viewer import ViewerNotInstalled, ensure_installed

        try:
            settings.viewer_dir = ensure_installed(settings.viewer_dir)
        except ViewerNotInstalled as e:
            print(f"dicomweb-server: --viewer: {e}", file=sys.stderr)
            return 2
    if settings.routes_file is not None:  # refuse a bad routes file before any worker starts
        from .routing.rules import RoutesError, load_routes

        try:
            load_routes(settings.routes_file)
        except RoutesError as e:
            print(f"dicomweb-server: --routes: {e}", file=sys.stderr)
            return 2
    if settings.retention_file is not None:  # a bad retention policy too
        from .policy.retention import PolicyError, load_policy

        try:
            load_policy(settings.retention_file)
        except PolicyError as e:
            print(f"dicomweb-server: --retention: {e}", file=sys.stderr)
            return 2
    if settings.access_rules or settings.access_rules_file is not None:  # a bad rules document: before the workers
        from .access.rules import AccessRules, RulesError

        try:
            AccessRules.load(settings.access_rules, settings.access_rules_file)
        except (RulesError, OSError, ValueError) as e:
            print(f"dicomweb-server: {e}" if isinstance(e, RulesError) else f"dicomweb-server: access rules: {e}",
                  file=sys.stderr)
            return 2
    if settings.audit_log is not None and (why := _audit_log_problem(Path(settings.audit_log))):
        # each worker and DIMSE listener opens it: they would die with a traceback, restarted forever
        print(f"dicomweb-server: --audit-log {settings.audit_log}: {why}", file=sys.stderr)
        return 2
    refused = _storage_refused(settings)  # an unreachable bucket: said once, before any worker starts
    if refused:
        print(f"dicomweb-server: {refused}", file=sys.stderr)
        return 2
    if settings.dimse_on():
        from .dimse.access import startup_warnings
        from .dimse.peers import PeersError, load_peers

        try:
            peers = load_peers(settings.dimse_peers_file)
        except PeersError as e:
            print(f"dicomweb-server: --dimse-peers-file: {e}", file=sys.stderr)
            return 2
        if settings.dimse_tls_port:  # a certificate or key that does not load: said now, not by each listener
            from .dimse.tls import TlsError, server_context

            try:
                server_context(settings.dimse_tls_cert_file, settings.dimse_tls_key_file, settings.dimse_tls_ca_file,
                               settings.dimse_tls_require_client_cert)
            except TlsError as e:
                print(f"dicomweb-server: --dimse-tls-port: {e}", file=sys.stderr)
                return 2
        for line in startup_warnings(settings, peers):  # who may use DIMSE (dimse/access.py)
            print(f"dicomweb-server: {line}", file=sys.stderr, flush=True)
    workers = settings.effective_workers()
    # DIMSE: its own process beside the uvicorn workers (its own core), or inside the one
    # worker of the in-memory index (an index lives in one process)
    taken = next((why for p in (settings.dimse_port, settings.dimse_tls_port)
                  if p and (why := _port_taken(settings.host, p))), None)
    if taken:  # HTTP goes on; the landing page then claims no DIMSE port
        from .dimse.scp import listen_error

        print(f"dicomweb-server: {listen_error(settings, OSError(taken))}", file=sys.stderr, flush=True)
        settings.dimse_port = settings.dimse_tls_port = 0
    settings.dimse_in_worker = settings.dimse_on() and settings.index == "memory"
    metrics_dir = _metrics_dir(workers > 1 or (settings.dimse_on() and not settings.dimse_in_worker))
    # workers (and the single-worker reloader-free run) read their settings from the environment
    for name, value in settings.model_dump(exclude_none=True).items():
        env = "DICOMWEB_" + name.upper()
        os.environ[env] = json.dumps(value) if isinstance(value, (list, dict)) else str(value)
    if not _archive_present(settings):
        why = _make_dirs(Path(settings.data_dir))
        if why is not None:
            print(f"dicomweb-server: --data-dir {settings.data_dir}: {why}", file=sys.stderr)
            return 2
        print(f"dicomweb-server: no archive at {_shown(settings.data_dir)}: created "
              f"({Path(settings.data_dir).resolve()})",
              file=sys.stderr, flush=True)
    raise_open_files_limit()
    from .dimse.listeners import dimse_processes, start_dimse, stop_dimse
    from .startup import announce_when_listening, warn_if_root

    warn_if_root(settings.host, _is_loopback(settings.host))
    announce_when_listening(settings, workers, 0 if settings.dimse_in_worker else dimse_processes(settings))
    dimse = start_dimse(settings)  # supervised: a dead one is replaced; they end with this process (a pipe)
    # uvicorn (one worker) re-raises the SIGTERM it handled once it has shut down: as SystemExit
    # here, the clean-up below runs (the default action would end the process first)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    try:
        _run_uvicorn(uvicorn, settings, workers)
    finally:
        stop_dimse(dimse, settings.shutdown_timeout)
        if metrics_dir is not None:
            shutil.rmtree(metrics_dir, ignore_errors=True)
    return 0


def _metrics_dir(several_processes: bool) -> Path | None:
    """prometheus-client's multi-process mode when this node serves from more than one
    process (uvicorn workers, the DIMSE listener process), so that ``/metrics`` from any
    worker sums them all (metrics.py). The folder is this node's own, on local disk (a
    temporary folder removed when serve ends): a data folder that several nodes share
    must not mix their counters, and its mmap'ed files do not belong on NFS. A
    ``PROMETHEUS_MULTIPROC_DIR`` already set is used as it is. Returns the folder to
    remove at the end, if this function made it; the folders of serve processes that
    are gone (SIGKILL) are removed here."""
    if not several_processes or "PROMETHEUS_MULTIPROC_DIR" in os.environ:
        return None
    tmp = Path(tempfile.gettempdir())
    for old in tmp.glob("dicomweb-metrics-*-*"):
        pid = old.name.split("-")[2]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(old, ignore_errors=True)
    path = Path(tempfile.mkdtemp(prefix=f"dicomweb-metrics-{os.getpid()}-", dir=tmp))
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(path)
    return path


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _run_uvicorn(uvicorn, settings, workers: int) -> None:
    from .api.limits import uvicorn_options

    options = dict(
        host=settings.host,
        port=settings.port,
        access_log=settings.access_log,
        log_level=settings.log_level,
        timeout_keep_alive=30,
        **uvicorn_options(settings),  # request-head timeout and size bound (api/limits.py)
        # SIGTERM: stop accepting, let requests in flight finish for at most this long, then
        # cancel them (never acknowledged) and close the archive (Archive.close); with several
        # workers uvicorn's supervisor sends each worker SIGTERM and restarts dead ones
        timeout_graceful_shutdown=settings.shutdown_timeout,
        # a starting worker imports pydicom, numpy and Pillow: on a loaded machine that takes
        # longer than uvicorn's 5 s default, and the supervisor then aborts a rolling restart
        # (SIGHUP) or kills a worker it takes for hung
        timeout_worker_healthcheck=30,
        # socket buffers are left to the kernel (autotuning); asyncio/uvloop set TCP_NODELAY
    )
    app = "dicomweb_server.app:create_app_from_env"
    if workers > 1 and settings.balance_connections:  # connections spread evenly over the workers
        from .api import balance

        balance.run(uvicorn.Config(app, factory=True, workers=workers, **options))
    else:
        uvicorn.run(app, factory=True, workers=workers if workers > 1 else None, **options)


def _storage_refused(settings) -> str | None:
    """Why ``--storage`` cannot be served (None when it can, or for the data folder)."""
    if settings.storage is None:
        return None
    from .store.s3 import BucketUnreachable, S3BlobStore

    try:
        S3BlobStore(Path(settings.data_dir), settings.storage, endpoint_url=settings.s3_endpoint_url).check_bucket()
    except BucketUnreachable as e:
        return str(e)
    return None


def _port_taken(host: str, port: int) -> str | None:
    """Why the HTTP port cannot be bound (bound and released at once, with SO_REUSEADDR as
    uvicorn binds it), or None."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            return e.strerror or str(e)
    return None


def _is_loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _sample_files() -> list[Path]:
    import pydicom

    root = Path(pydicom.__file__).parent / "data" / "test_files"
    return sorted(p for p in root.rglob("*") if p.is_file())


def _import(args: argparse.Namespace) -> int:
    """Exit status: 0 every file stored (or already stored), 1 some refused (named by
    --verbose or --report; pydicom's samples, broken on purpose, do not count), 2 a bad
    argument (nothing created)."""
    import logging
    import warnings

    from . import importer

    # pydicom warns about every oddity of the files it reads; the summary below reports what matters
    warnings.filterwarnings("ignore", module="pydicom")
    logging.getLogger("pydicom").setLevel(logging.ERROR)

    settings = _settings(args)
    problems = importer.bad_paths(args.paths)
    for line in problems:
        print(f"dicomweb-server import: {line}", file=sys.stderr)
    if problems:
        return 2
    paths, broken = importer.files_of([Path(p) for p in args.paths])
    samples = _sample_files() if args.samples else []
    if not paths and not broken and not samples:
        print("dicomweb-server import: no files given (PATH... or --samples)", file=sys.stderr)
        return 2
    if not _routes_ok(settings, "import") or not _usable_data_dir(settings, "import"):
        return 2
    archive = _open_archive(settings, "import")
    run = importer.ImportRun(verbose=args.verbose, expected=set(samples))
    try:
        importer.run_import(archive, paths + samples, broken, run, quiet=args.quiet)
    finally:
        archive.close()
    if args.report:
        Path(args.report).write_text("".join(line + "\n" for line in run.not_stored))
    print(run.summary(Path(settings.data_dir)))
    if args.samples and run.refused:
        print("(pydicom's sample set includes broken files and several files per SOP Instance UID on purpose)")
    if run.not_stored and not (args.report or args.verbose):
        print("(which files and why: --verbose, or --report FILE)")
    elif args.report:
        print(f"files not stored, and why: {args.report} ({len(run.not_stored)} line(s))")
    return 1 if run.unexpected else 0


def _usable_data_dir(settings, command: str) -> bool:
    """Whether the data folder is, or can become, a folder (one line on stderr when not);
    creates it when missing. Nothing is left behind when it cannot be created."""
    data = Path(settings.data_dir)
    why = _data_dir_problem(data)
    if why is None and not data.is_dir():
        why = _make_dirs(data)
    if why is not None:
        print(f"dicomweb-server {command}: --data-dir {data}: {why}", file=sys.stderr)
        return False
    return True


def _data_dir_problem(data: Path) -> str | None:
    """Why ``data`` cannot be (or become) the data folder, or None; creates nothing."""
    if data.is_symlink() and not data.exists():
        return f"a broken symbolic link (to {os.readlink(data)})"
    if data.exists():
        if not data.is_dir():
            return "not a folder (a file is there)"
        if not os.access(data, os.W_OK | os.X_OK):
            return "not writable"
        return None
    above = data.absolute().parent
    while not above.exists() and above != above.parent:
        above = above.parent
    if not above.is_dir():
        return f"cannot be created: {above} is not a folder"
    if not os.access(above, os.W_OK | os.X_OK):
        return f"cannot be created: {above} is not writable"
    return None


def _credential_files(settings) -> tuple[str | None, bool]:
    """(why the API keys or basic users file cannot be used, or None; whether any credential
    is configured: a key, a basic user or OIDC). Read as the workers read them
    (access/audit.py ``load_json_file``): JSON objects."""
    from .access.audit import load_json_file

    found = {"--api-keys-file": {}, "--basic-users-file": {}}
    for flag, path in (("--api-keys-file", settings.api_keys_file), ("--basic-users-file", settings.basic_users_file)):
        if path is None:
            continue
        try:
            found[flag] = load_json_file(path)
        except OSError as e:
            return f"{flag} {path}: cannot read it: {e.strerror or e}", False
        except ValueError as e:
            return f"{flag} {path}: not JSON: {e}", False
        if not isinstance(found[flag], dict) or not all(isinstance(v, (list, dict)) for v in found[flag].values()):
            form = '{"token": ["read", "write"]}' if flag == "--api-keys-file" else \
                '{"user": {"password_sha256": "...", "scopes": ["read"]}}'
            return f"{flag} {path}: not of the form {form}", False
    return None, bool(found["--api-keys-file"] or settings.api_keys or found["--basic-users-file"]
                      or settings.oidc_jwks_url)


def _audit_log_problem(path: Path) -> str | None:
    """Why the audit log file cannot be opened for appending, or None; creates nothing
    (the folder is the operator's to make, with its owner and mode)."""
    if path.is_dir():
        return "a folder, not a file"
    if path.exists():
        return None if os.access(path, os.W_OK) else "not writable"
    folder = path.absolute().parent
    if not folder.is_dir():
        return f"folder {folder} does not exist (create it, writable by the archive's user)"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"cannot create the file: folder {folder} is not writable"
    return None


def _make_dirs(data: Path) -> str | None:
    """mkdir -p; on failure, remove the folders made and say why."""
    made = []
    for p in reversed([data.absolute(), *data.absolute().parents]):
        if p.exists():
            continue
        try:
            p.mkdir()
        except OSError as e:
            for q in reversed(made):
                with contextlib.suppress(OSError):
                    q.rmdir()
            return f"cannot be created: {e.strerror or e}"
        made.append(p)
    return None


def _archive_present(settings) -> bool:
    """Whether the data folder holds an archive: its SQLite index or its blobs/ folder
    (with the PostgreSQL index or S3 storage the index or the files are elsewhere: the
    folder itself)."""
    data = Path(settings.data_dir)
    if settings.index == "postgresql" or settings.storage is not None:
        return data.is_dir()
    return (data / "index.sqlite").is_file() or (data / "blobs").is_dir()


def _existing_archive(settings, command: str) -> bool:
    """check, queue: an archive must be there (they never create one); one line when not."""
    if _archive_present(settings):
        return True
    data = Path(settings.data_dir)
    print(f"dicomweb-server {command}: no archive at {_shown(data)} ({data.absolute()}): give --data-dir "
          "(or DICOMWEB_DATA_DIR) the folder of the archive", file=sys.stderr)
    return False


def _shown(path) -> str:
    """A folder as the user would type it: ``./data`` for the relative ``data``."""
    text = str(path)
    return text if Path(text).is_absolute() or text.startswith(".") else f"./{text}"


def _routes_ok(settings, command: str) -> bool:
    """A bad routes file: one line (before anything is created)."""
    if settings.routes_file is None:
        return True
    from .routing.rules import RoutesError, load_routes

    try:
        load_routes(settings.routes_file)
    except RoutesError as e:
        print(f"dicomweb-server {command}: --routes: {e}", file=sys.stderr)
        return False
    return True


def _check(args: argparse.Namespace) -> int:
    from .check import reconcile

    settings = _settings(args)
    if not _existing_archive(settings, "check"):
        return 2
    archive = _open_archive(settings, "check")
    try:
        report = reconcile(archive, repair=args.repair, grace=args.grace)
    finally:
        archive.close()
    print(report.summary())
    # exit 1: problems found and left as they are (a dry run, or a repair refused because the
    # index and the storage share no instance); --repair handles every kind
    return 0 if report.clean or (args.repair and not report.refused) else 1


def _purge(args: argparse.Namespace) -> int:
    """Remove the instances rejected more than keep_rejected days ago (lifecycle/reject.py)
    and the earlier versions replaced more than keep_versions days ago
    (lifecycle/versions.py): what the server does at start and hourly."""
    from .archive import Archive
    from .lifecycle.reject import purge
    from .lifecycle.versions import purge as purge_versions

    settings = _settings(args)
    if not _existing_archive(settings, "purge"):
        return 2
    archive = Archive.open(settings)
    try:
        n = purge(archive)
        v = purge_versions(archive)
    finally:
        archive.close()
    print(f"purged {n} rejected instance(s) older than {settings.keep_rejected:g} day(s)")
    print(f"purged {v} earlier version(s) replaced more than {settings.keep_versions:g} day(s) ago")
    return 0


def _retention(args: argparse.Namespace) -> int:
    """policy/retention_cli.py: one run of the retention policy (--dry-run: the list only)."""
    from .policy import retention_cli

    settings = _settings(args)
    if not _existing_archive(settings, "retention"):
        return 2
    return retention_cli.main(args, settings, _open_archive)


def _update(args: argparse.Namespace) -> int:
    """``update STUDY --set Keyword=value ... [--series S]``: lifecycle/update.py, as
    ``POST .../$update``; the audit log (when configured) names the OS user and each change."""
    import getpass

    import orjson

    from .archive import Archive
    from .lifecycle.update import UpdateError, changes_from_keywords, update

    settings = _settings(args)
    if not _existing_archive(settings, "update"):
        return 2
    try:
        changes = changes_from_keywords(args.set, "series" if args.series else "study")
    except UpdateError as e:
        print(f"dicomweb-server update: {e.message}", file=sys.stderr)
        return 2
    archive = Archive.open(settings)
    try:
        done = update(archive, args.study, args.series, changes)
    except UpdateError as e:
        print(f"dicomweb-server update: {e.message}", file=sys.stderr)
        return 1
    finally:
        archive.close()
    if settings.audit_log is not None:
        from .access.audit import audit_log, configure_audit_file

        configure_audit_file(settings.audit_log)
        audit_log.info(orjson.dumps({"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "action": "update",
                                     "user": getpass.getuser(), "auth": "command line", "study": args.study,
                                     "series": args.series, "changes": done.changes, "outcome": 200}).decode())
    print(f"{done.instances} instance(s) of study {args.study} updated in {done.seconds:.2f} s")
    return 0


def _open_archive(settings, command: str):
    """Archive.open for a command; a bad routes file exits 2 with its line, not a traceback."""
    from .archive import Archive
    from .policy.retention import PolicyError
    from .routing import RoutesError

    try:
        return Archive.open(settings)
    except RoutesError as e:
        print(f"dicomweb-server {command}: --routes: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    except PolicyError as e:
        print(f"dicomweb-server {command}: --retention: {e}", file=sys.stderr)
        raise SystemExit(2) from None


def build_parser() -> argparse.ArgumentParser:
    """The command line: each command with its flags (serve's map onto :class:`Settings`
    fields by ``dest``; ``scripts/gen_docs.py`` reads them for docs/configuration.md)."""
    from . import __version__

    parser = argparse.ArgumentParser(
        prog="dicomweb-server", description="DICOMweb (PS3.18) archive. Without a command: serve.",
        epilog="`dicomweb-server COMMAND --help` shows the options of a command; every serve option is also "
               "a DICOMWEB_* environment variable (docs/configuration.md).")
    parser.add_argument("--version", action="version", version=f"dicomweb-server {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, title="commands", metavar="COMMAND")

    serve = sub.add_parser("serve", help="run the archive (default command)")
    serve.add_argument("--host", help="listen address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port (default 8080)")
    serve.add_argument("--workers", type=int, help="worker processes (default: one per core with sqlite)")
    serve.add_argument("--prefix", help="serve DICOMweb under this path, e.g. /dicomweb")
    serve.add_argument("--public-url", dest="public_url", help="base URL written into RetrieveURLs")
    serve.add_argument("--cors-origin", dest="cors_origins", action="append", help="allowed CORS origin (repeat)")
    serve.add_argument("--access-log", dest="access_log", action="store_true", default=None)
    serve.add_argument("--api-keys-file", dest="api_keys_file", help='JSON {"token": ["read","write","delete"]}')
    serve.add_argument("--access-rules-file", dest="access_rules_file",
                       help='JSON {"identities": {"basic:alice": ["cardio"]}, "claim": "groups", "default": "*"}')
    serve.add_argument("--basic-users-file", dest="basic_users_file",
                       help='JSON {"user": {"password_sha256": "...", "scopes": [...]}}')
    serve.add_argument("--oidc-issuer", dest="oidc_issuer", help="expected JWT issuer (iss)")
    serve.add_argument("--oidc-audience", dest="oidc_audience", help="expected JWT audience (aud)")
    serve.add_argument("--oidc-jwks-url", dest="oidc_jwks_url", help="the issuer's JWKS URL")
    serve.add_argument("--oidc-client-id", dest="oidc_client_id",
                       help="client id of the viewer's and /ui/'s OIDC login (code + PKCE) at the issuer")
    serve.add_argument("--audit-log", dest="audit_log", help="append one JSON line per request to this file")
    serve.add_argument("--share-max-seconds", dest="share_max_seconds", type=int,
                       help="the longest a share link may live, in seconds (default 30 days)")
    serve.add_argument("--insecure", action="store_true", default=None,
                       help="allow a non-loopback --host without authentication")
    serve.add_argument("--log-level", dest="log_level")
    serve.add_argument("--routes", dest="routes_file", help="TOML routes file: forward stored instances")
    serve.add_argument("--retention", dest="retention_file",
                       help="TOML retention policy: rules and quotas (docs/retention.md)")
    serve.add_argument("--retention-interval", dest="retention_interval", type=float,
                       help="seconds between the server's retention runs (default 0: off)")
    serve.add_argument("--viewer", action="store_true", default=None, help="serve the OHIF viewer at /viewer")
    serve.add_argument("--viewer-dir", dest="viewer_dir", help="OHIF dist/ folder (default: fetched with npm)")
    serve.add_argument("--dimse-port", dest="dimse_port", type=int, help="DIMSE port (default 11112; 0 = off, or TLS only with --dimse-tls-port)")
    serve.add_argument("--dimse-tls-port", dest="dimse_tls_port", type=int,
                       help="DICOM TLS port beside --dimse-port (PS3.15 Annex B; default 0 = off)")
    serve.add_argument("--dimse-tls-cert-file", dest="dimse_tls_cert_file", help="PEM certificate of the TLS port")
    serve.add_argument("--dimse-tls-key-file", dest="dimse_tls_key_file", help="PEM private key of the TLS port")
    serve.add_argument("--dimse-tls-ca-file", dest="dimse_tls_ca_file",
                       help="PEM CA certificate(s) client certificates are checked against")
    serve.add_argument("--dimse-tls-require-client-cert", dest="dimse_tls_require_client_cert", action="store_true",
                       default=None, help="refuse TLS clients without a certificate signed by --dimse-tls-ca-file")
    serve.add_argument("--ae-title", dest="ae_title", help="this archive's AE title (default DICOMWEB)")
    serve.add_argument("--dimse-peers-file", dest="dimse_peers_file",
                       help="JSON/TOML of C-MOVE destinations: AE title -> {host, port}")
    serve.add_argument("--dimse-commitment-retry", dest="dimse_commitment_retry", type=float,
                       help="storage commitment: seconds before an undelivered report is sent again (default 10, "
                            "doubled each attempt)")
    serve.add_argument("--dimse-commitment-max-attempts", dest="dimse_commitment_max_attempts", type=int,
                       help="storage commitment: attempts before a report is a dead letter (default 20)")
    serve.add_argument("--dimse-character-set", dest="dimse_character_set",
                       help="Specific Character Set preferred for non-ASCII text sent over DIMSE when the SCU asks "
                            "for none it can use (default ISO_IR 100; else ISO_IR 192; empty: UTF-8)")
    serve.add_argument("--hl7-port", dest="hl7_port", type=int,
                       help="MLLP port for HL7 v2 ORM^O01 orders into the worklist (default 0 = off)")
    serve.add_argument("--hl7-max-message", dest="hl7_max_message", type=int,
                       help="the longest HL7 message read, in bytes (default 1 MiB)")
    serve.add_argument("--dimse-allow-ae", dest="dimse_allowed_aes", action="append",
                       help="accept associations only from this calling AE title (repeat; default any)")
    serve.add_argument("--dimse-check-called-ae", dest="dimse_check_called_ae", action="store_true", default=None,
                       help="reject associations whose called AE title is not --ae-title")
    serve.add_argument("--dimse-max-associations", dest="dimse_max_associations", type=int,
                       help="concurrent associations of this node, all listener processes together (default 64)")
    serve.add_argument("--dimse-max-associations-per-peer", dest="dimse_max_associations_per_peer", type=int,
                       help="concurrent associations of one peer address, and of one calling AE title "
                            "(default: a quarter of --dimse-max-associations)")
    serve.add_argument("--dimse-processes", dest="dimse_processes", type=int,
                       help="DIMSE listener processes sharing the port (default: two per core, at least 2, at most 8)")
    _add_settings_args(serve)
    serve.set_defaults(func=_serve)

    imp = sub.add_parser("import", help="store DICOM files from folders into the archive")
    imp.add_argument("paths", nargs="*", help="files or folders (recursive)")
    imp.add_argument("--samples", action="store_true", help="also import the DICOM files that ship inside pydicom")
    imp.add_argument("--quiet", action="store_true", help="no progress bar")
    imp.add_argument("--verbose", action="store_true", help="print each file not stored, and why, to stderr")
    imp.add_argument("--report", metavar="FILE", help="write each file not stored, and why, to FILE (path TAB reason)")
    imp.add_argument("--routes", dest="routes_file",
                     help="TOML routes file (or DICOMWEB_ROUTES_FILE): owe the forwards of what is imported, "
                          "as the server does (its forwarder delivers them)")
    _add_settings_args(imp)
    imp.set_defaults(func=_import)

    chk = sub.add_parser("check", help="reconcile the index with the stored files or objects; names each problem")
    chk.add_argument("--repair", action="store_true",
                     help="fix each problem (re-index, refile, drop rows without files; unreadable -> lost+found/)")
    chk.add_argument("--routes", dest="routes_file", help="TOML routes file (or DICOMWEB_ROUTES_FILE): the "
                     "instances re-indexed owe their forwards, as if stored by the server")
    _add_settings_args(chk)
    chk.add_argument("--grace", type=float, default=900.0, metavar="SECONDS",
                     help="object storage: leave unindexed objects younger than this alone (a store may be "
                          "between its PUT and its index commit; default 900)")
    chk.set_defaults(func=_check)

    pur = sub.add_parser("purge", help="remove the rejected instances older than keep_rejected days "
                                       "(DICOMWEB_KEEP_REJECTED, default 30) and the earlier versions replaced "
                                       "more than keep_versions days ago (DICOMWEB_KEEP_VERSIONS, default 30)")
    _add_settings_args(pur)
    pur.set_defaults(func=_purge)

    from .dimse import pull_cli
    from .policy.retention_cli import add_parser as add_retention_parser

    add_retention_parser(sub, _add_settings_args, _retention)
    pull_cli.add_parser(sub, _add_settings_args, _settings, _existing_archive, _open_archive)
    from .policy import recompress_cli  # (its command: settings, then the archive, as retention's)

    recompress_cli.add_parser(sub, _add_settings_args, lambda a: recompress_cli.command(
        a, _settings(a), _existing_archive, _open_archive))

    upd = sub.add_parser("update", help="change Patient/Study (or, with --series, Series) attributes of a stored "
                                        "study: every instance gets a new version (lifecycle/update.py)")
    upd.add_argument("study")
    upd.add_argument("--series", help="SeriesInstanceUID: change Series attributes of this series")
    upd.add_argument("--set", action="append", required=True, metavar="Keyword=value",
                     help="an attribute and its new value (repeat; PN as Family^Given; multiple values split by \\)")
    _add_settings_args(upd)
    upd.set_defaults(func=_update)

    from .routing import commands as routing_commands

    routing_commands.add_parsers(sub, _add_settings_args, _settings, _existing_archive, _open_archive)

    mig = sub.add_parser("migrate", help="create or migrate the PostgreSQL index schema (archives also do it "
                                         "when they start)")
    mig.add_argument("--database-url", dest="database_url",
                     help="postgresql://user@host:port/db (env DICOMWEB_DATABASE_URL)")
    mig.set_defaults(func=_migrate)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version")):
        argv = ["serve"] + argv
    args = build_parser().parse_args(argv)
    if args.command == "serve" and not all(k in os.environ for k in _MALLOC_ENV):
        os.environ.update({k: v for k, v in _MALLOC_ENV.items() if k not in os.environ})
        os.execv(sys.executable, [sys.executable, "-m", "dicomweb_server.cli", *argv])
    from .store.s3 import BucketUnreachable

    try:
        return args.func(args)
    except BucketUnreachable as e:  # check, import, queue...: said in one line, as serve does
        print(f"dicomweb-server: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
