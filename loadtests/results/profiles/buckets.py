"""Buckets of a py-spy raw (collapsed) profile: python buckets.py FILE.collapsed[.gz] ...
Each sample goes to the first rule (in order) any of its frames matches."""
import sys, collections, glob, gzip
RULES = [
    ("parse + describe (pydicom, DICOM JSON)", ("describe_instance",)),
    ("index commit (group commit, SQLite)", ("GroupCommitter", "SQLiteIndex")),
    ("file write/fsync/link + locks", ("BlobStore", "SpooledPart.spool")),
    ("Archive.store, other", ("Archive.store", "Archive._place")),
    ("multipart parser + spool files", ("PartSpooler", "python_multipart")),
    ("thread pool hand-off (anyio)", ("anyio", "run_in_threadpool", "WorkerThread", "concurrent/futures", "threading.py")),
    ("STOW response (JSON, headers)", ("_store_response",)),
    ("body receive loop (our _spool_body / Request.stream)", ("_spool_body", "stow.py:88", "stow.py:89", "Request.stream", "asyncio/timeouts")),
    ("FastAPI/Starlette request handling", ("fastapi", "starlette", "limits.py", "proxy_headers", "_StowEndpoint", "stow.py")),
    ("uvicorn HTTP (httptools parse, send)", ("httptools_impl",)),
    ("event loop", ("Runner.run", "base_events", "uvloop")),
]
def bucket(frames):
    for name, keys in RULES:
        for fr in frames:
            if any(k in fr for k in keys):
                return name
    return "other"
for pat in sys.argv[1:]:
    c = collections.Counter(); total = 0
    for f in glob.glob(pat):
        for line in (gzip.open(f, "rt") if f.endswith(".gz") else open(f)):
            stack, n = line.rstrip().rsplit(" ", 1); n = int(n)
            total += n; c[bucket(stack.split(";"))] += n
    print(f"{pat}: {total} samples")
    for k, v in c.most_common(): print(f"  {100*v/total:5.1f}%  {k}")
