"""Buckets of py-spy raw (collapsed) profiles, deepest frame first: each sample goes
to the bucket of the frame nearest its leaf that matches a rule (so time spent
sending inside a middleware counts as sending, not as middleware).
    python leaf_buckets.py FILE.collapsed[.gz] ..."""
import collections
import gzip
import sys

RULES = [
    ("socket write (uvicorn RequestResponseCycle.send)", ("RequestResponseCycle.send",)),
    ("HTTP parse (httptools callbacks, uvicorn protocol)", ("HttpToolsProtocol.", "GuardedHttpToolsProtocol")),
    ("describe: pydicom parse + DICOM JSON", ("describe_instance",)),
    ("index commit (group commit, SQLite)", ("GroupCommitter", "SQLiteIndex", "SQLIndex")),
    ("file write / sync / link / locks", ("BlobStore", "SpooledPart.spool")),
    ("file reads (retrieve)", ("read_files", "open_files", "instance_payload", "file_chunks", "_read_span")),
    ("multipart parser", ("PartSpooler", "python_multipart")),
    ("thread hand-off (executor, futures, anyio)", ("run_blocking", "run_in_threadpool", "_chain_future",
                                                    "futures.py", "thread.py", "threading.py", "anyio")),
    ("STOW response JSON", ("_store_response",)),
    ("request body loop (_spool_body)", ("_spool_body",)),
    ("Archive.store, other", ("Archive.",)),
    ("middleware, routing, endpoints (Starlette/FastAPI/ours)", ("starlette", "fastapi", "limits.py", "methods.py",
                                                                 "proxy_headers", "stow.py", "wado.py", "responses.py")),
    ("event loop", ("Runner.run", "base_events", "uvloop", "server.py")),
]


def bucket(frames):
    for fr in reversed(frames):
        for name, keys in RULES:
            if any(k in fr for k in keys):
                return name
    return "other"


for pat in sys.argv[1:]:
    c = collections.Counter()
    total = 0
    for line in (gzip.open(pat, "rt") if pat.endswith(".gz") else open(pat)):
        stack, n = line.rstrip().rsplit(" ", 1)
        total += int(n)
        c[bucket(stack.split(";"))] += int(n)
    print(f"{pat}: {total} samples (GIL held)")
    for k, v in c.most_common():
        print(f"  {100 * v / total:5.1f}%  {k}")
