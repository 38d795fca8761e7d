"""Buckets of py-spy raw (collapsed) profiles, deepest frame first: each sample goes
to the bucket of the frame nearest its leaf that matches a rule (so time spent
sending inside a middleware counts as sending, not as middleware).
    python leaf_buckets.py FILE.collapsed[.gz] ...
    python leaf_buckets.py --dimse FILE.raw[.gz] ...   (the DIMSE listener's C-STORE buckets)"""
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

#: the DIMSE listener receiving C-STOREs (issue 33, cstore-receive-ab.md)
DIMSE_RULES = [
    ("archive: describe (parse + DICOM JSON)", ("describe_instance",)),
    ("archive: index commit (group commit, SQLite)", ("GroupCommitter", "SQLiteIndex", "SQLIndex")),
    ("archive: file fsync / link / folder syncs / locks", ("BlobStore", "fsync_dir", "FolderSyncs")),
    ("archive: SOP Class/Instance UID check", ("_fill_source_ae_and_check",)),
    ("archive: store, other", ("Archive.", "store_received", "store_one")),
    ("pynetdicom DIMSE decode (command Dataset, primitive)", ("decode_msg", "message_to_primitive",
                                                               "DIMSEServiceProvider.receive_primitive")),
    ("C-STORE-RQ parse + spool file open (ours)", ("begin (", "Receiver.__init__", "parse_c_store_rq", "_request (")),
    ("spool file create/write (NamedTemporaryFile / Receiver.write)", ("NamedTemporaryFile", "tempfile.py",
                                                                       "Receiver.write", "_encoded_file_meta")),
    ("dispatch: association thread, service class, events", ("_assoc_run_reactor", "_serve_request",
                                                             "StorageServiceClass", "trigger (", "validate_status")),
    ("C-STORE-RSP: encode, queue, state machine, socket", ("send_msg", "response_pdu", "DT_1", "do_action",
                                                           "DULServiceProvider._send", "AssociationSocket.send",
                                                           "send_pdu")),
    ("wake-ups (Event.set, Condition.notify, queue put)", ("Event.set", "notify", "put_and_notify")),
    ("waits (Condition/Event wait, select)", ("Condition.wait", "Event.wait", "_dul_wait", "select")),
    ("PDU read (recv, P-DATA items, assembly checks)", ("read_pdu_data", "_bounded_recv", "pdv_items",
                                                        "receive_primitive", "_broken_rule")),
    ("DUL loop, other", ("_dul_run_reactor",)),
]


def bucket(frames, rules=RULES):
    for fr in reversed(frames):
        for name, keys in rules:
            if any(k in fr for k in keys):
                return name
    return "other"


args = sys.argv[1:]
rules = DIMSE_RULES if args[:1] == ["--dimse"] else RULES
for pat in args[1:] if args[:1] == ["--dimse"] else args:
    c = collections.Counter()
    total = 0
    for line in (gzip.open(pat, "rt") if pat.endswith(".gz") else open(pat)):
        stack, n = line.rstrip().rsplit(" ", 1)
        total += int(n)
        c[bucket(stack.split(";"), rules)] += int(n)
    print(f"{pat}: {total} samples (GIL held)")
    for k, v in c.most_common():
        print(f"  {100 * v / total:5.1f}%  {k}")
