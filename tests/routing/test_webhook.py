"""Webhooks (routing/webhook.py): every change of the change log POSTed as its change
feed entry through the outbox (leases, retries, dead letters), signed with HMAC-SHA256
when a secret is set; at least once across a SIGKILL of the archive."""

from __future__ import annotations

import hashlib
import hmac
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import orjson
import pytest
from pydicom.uid import generate_uid as pydicom_uid

from dicomweb_server.routing.rules import RoutesError, load_routes
from tests.helpers import LiveServer, make_dataset, multipart, to_bytes
from tests.reliability.test_crash import CLIENTS, Server, _storer
from tests.routing.conftest import ALL, FAST, wait_for

SECRET = "s3cret"


class HookSink:
    """An HTTP server receiving webhook POSTs: keeps each body (and whether its signature
    was right); answers 500 to the first ``fail_first`` requests."""

    def __init__(self, fail_first: int = 0) -> None:
        self.bodies: list[dict] = []
        self.bad_signatures = 0
        self.fail_first = fail_first
        self.headers: list[dict] = []
        self._lock = threading.Lock()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                want = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
                with sink._lock:
                    if sink.fail_first > 0:
                        sink.fail_first -= 1
                        status = 500
                    else:
                        status = 204
                        sink.bodies.append(orjson.loads(body))
                        sink.headers.append(dict(self.headers))
                        sink.bad_signatures += self.headers.get("X-DICOMweb-Signature") != want
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def sequences(self) -> set[int]:
        with self._lock:
            return {b["Sequence"] for b in self.bodies}

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hooks():
    s = HookSink()
    yield s
    s.stop()


def webhook_routes(path, url: str, secret: bool = True) -> str:
    path.write_text(f"""
[[destinations]]
name = "events"
webhook = {{ url = "{url}"{f', secret = "{SECRET}"' if secret else ''} }}
headers = {{ X-Tenant = "ward-7" }}
{FAST}""")
    return str(path)


def stow(url: str, datasets) -> None:
    body, ctype = multipart([to_bytes(ds) for ds in datasets])
    assert httpx.post(url + "/studies", content=body, headers={"Content-Type": ctype}, timeout=30).status_code == 200


def test_routes_file_webhook_fields(tmp_path):
    routes = load_routes(webhook_routes(tmp_path / "r.toml", "https://hooks.example/x"))
    dest = routes.destinations["events"]
    assert (dest.webhook.url, dest.webhook.secret, dest.headers) == ("https://hooks.example/x", SECRET,
                                                                     {"X-Tenant": "ward-7"})
    bad = {
        'webhook = { url = "ftp://x" }': r"not an http\(s\) URL",
        'webhook = { url = "http://x", token = "t" }': "unknown field",
        'webhook = { url = "http://x" }\nstow_url = "http://y"': "exactly one of",
        'webhook = { url = "http://x", secret = "" }': "secret must be",
    }
    for text, message in bad.items():
        (tmp_path / "b.toml").write_text(f'[[destinations]]\nname = "e"\n{text}\n')
        with pytest.raises(RoutesError, match=message):
            load_routes(tmp_path / "b.toml")
    (tmp_path / "c.toml").write_text('[[destinations]]\nname = "e"\nwebhook = { url = "http://x" }\n'
                                     '[[rules]]\ndestinations = ["e"]\n')
    with pytest.raises(RoutesError, match="is a webhook"):
        load_routes(tmp_path / "c.toml")


@pytest.mark.parametrize("backend", ALL, indirect=True)
def test_every_change_is_posted_signed_and_retried(tmp_path, backend):
    """Creates and deletes reach the webhook as change feed entries (what /changefeed
    answers, without Metadata), signed, with the configured headers; the first answers
    (500) are retried until a 2xx."""
    sink = HookSink(fail_first=2)
    srv = LiveServer(tmp_path / "data", backend.index, routes_file=webhook_routes(tmp_path / "r.toml", sink.url),
                     **backend.settings).start()
    try:
        a, b = make_dataset(PatientID="W"), make_dataset(PatientID="W")
        stow(srv.url, [a, b])
        assert httpx.delete(f"{srv.url}/studies/{b.StudyInstanceUID}").status_code == 204
        wait_for(lambda: sink.sequences() == {1, 2, 3}, what="three changes at the webhook")
        feed = httpx.get(srv.url + "/changefeed", params={"includemetadata": "false"}).json()
        got = {body["Sequence"]: body for body in sink.bodies}
        for entry in feed:  # the state when sent: b's create may have been sent before its delete
            assert {k: v for k, v in got[entry["Sequence"]].items() if k != "State"} == \
                {k: v for k, v in entry.items() if k != "State"}
        assert [got[s]["Action"] for s in (1, 2, 3)] == ["create", "create", "delete"]
        assert got[3]["SopInstanceUid"] == b.SOPInstanceUID and got[1]["State"] == "current"
        assert sink.bad_signatures == 0
        assert all(h["X-Tenant"] == "ward-7" and h["Content-Type"] == "application/json" for h in sink.headers)
        q = wait_for(lambda: (lambda s: s if s["delivered"] == 3 else None)(
            httpx.get(srv.url + "/admin/queue").json()["destinations"]["events"]), what="3 delivered")
        assert q["failed"] == 0 and q["pending"] == 0
        r = httpx.post(f"{srv.url}/admin/export/events/studies/{a.StudyInstanceUID}")
        assert r.status_code == 400 and "is a webhook" in r.json()["detail"]
    finally:
        srv.stop()
        sink.stop()


@pytest.mark.parametrize("backend", ALL, indirect=True)
def test_sigkill_loses_no_webhook(tmp_path, hooks, monkeypatch, backend):
    """Storers keep storing while the archive (a real process) is killed with SIGKILL
    while it notifies: after a restart the webhook has received every change of the
    change log (which holds a create for every acknowledged instance) at least once."""
    monkeypatch.setenv("DICOMWEB_ROUTES_FILE", webhook_routes(tmp_path / "r.toml", hooks.url))
    backend.env(monkeypatch)
    data = tmp_path / "data"
    srv = Server(data, backend.index)
    acked: dict[str, bytes] = {}
    stop = threading.Event()
    threads = [threading.Thread(target=_storer, args=(srv.url, i, acked, stop)) for i in range(CLIENTS)]
    for t in threads:
        t.start()
    # kill while notifying AND with changes owed (acknowledged, not yet at the webhook)
    wait_for(lambda: len(hooks.sequences()) >= 10 and len(acked) - len(hooks.sequences()) >= 3, timeout=60,
             what="notifying under way with changes owed")
    srv.kill()
    stop.set()
    for t in threads:
        t.join(30)
    assert len(acked) > len(hooks.sequences())
    srv = Server(data, backend.index)
    try:
        latest = httpx.get(srv.url + "/changefeed/latest", params={"includemetadata": "false"}).json()["Sequence"]
        wait_for(lambda: hooks.sequences() == set(range(1, latest + 1)), timeout=90, what="every change")
        created = {b["SopInstanceUid"] for b in hooks.bodies if b["Action"] == "create"}
        assert set(acked) <= created
        assert hooks.bad_signatures == 0
    finally:
        srv.kill()


@pytest.mark.parametrize("backend", ALL, indirect=True)
def test_study_stable_event_after_the_last_instance(tmp_path, hooks, backend):
    """``stable_after``: one "stable" event per study, sent once no new instance of it
    came for that long (each new instance pushes it back), none for a study deleted
    before; a new instance after the event makes another."""
    routes = tmp_path / "r.toml"
    webhook_routes(routes, hooks.url)
    routes.write_text(routes.read_text().replace(f'secret = "{SECRET}"', f'secret = "{SECRET}", stable_after = 1.5'))
    srv = LiveServer(tmp_path / "data", backend.index, routes_file=str(routes), **backend.settings).start()
    try:
        st, gone = pydicom_uid(), pydicom_uid()
        stow(srv.url, [make_dataset(study=st, PatientID="S"), make_dataset(study=gone, PatientID="G")])
        assert httpx.delete(f"{srv.url}/studies/{gone}").status_code == 204
        for _ in range(2):  # within stable_after of each other: the event waits for the last
            time.sleep(0.8)
            last = time.monotonic()  # before the store: the server's clock starts at its commit
            stow(srv.url, [make_dataset(study=st, PatientID="S")])

        def stable():
            with hooks._lock:
                return [b for b in hooks.bodies if b["Action"] == "stable"]

        (event,) = wait_for(stable, timeout=30, what="the stable event")
        assert time.monotonic() - last >= 1.5
        assert (event["StudyInstanceUid"], event["NumberOfStudyRelatedInstances"]) == (st, 3)
        assert list(event) == ["Action", "StudyInstanceUid", "Timestamp", "NumberOfStudyRelatedInstances"]
        time.sleep(2.0)
        assert len(stable()) == 1  # one event; none for the deleted study
        stow(srv.url, [make_dataset(study=st, PatientID="S")])
        wait_for(lambda: len(stable()) == 2, timeout=30, what="a second stable event")
        assert stable()[1]["NumberOfStudyRelatedInstances"] == 4 and hooks.bad_signatures == 0
    finally:
        srv.stop()
