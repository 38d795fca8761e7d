"""DICOM TLS (PS3.15 Annex B; dicomweb_server/dimse/tls.py): the TLS listener port beside
the plain one, and TLS on the SCU side (a routing C-STORE destination, a C-MOVE destination,
a storage commitment report on a new association, a pull).

A CA, a server certificate (for 127.0.0.1) and a client certificate are made at test time
with ``cryptography``; pynetdicom and DCMTK's ``storescu +tls`` are the clients."""

from __future__ import annotations

import datetime
import hashlib
import ipaddress
import socket
import ssl
import struct
import subprocess
import time
from pathlib import Path

import pydicom
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from pydicom import uid as U
from pynetdicom import AE, build_context
from pynetdicom.sop_class import CTImageStorage, Verification

from dicomweb_server.archive import Archive
from dicomweb_server.dimse import status as S
from dicomweb_server.dimse.scp import DimseServer
from dicomweb_server.dimse.tls import TlsClient, client_context
from dicomweb_server.settings import Settings
from tests.helpers import make_dataset, to_bytes


# --- certificates ---------------------------------------------------------------------------

def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _cert(subject: str, key, issuer: str, issuer_key, *, ca: bool = False, usage=None) -> x509.Certificate:
    now = datetime.datetime.now(datetime.timezone.utc)
    b = (x509.CertificateBuilder().subject_name(_name(subject)).issuer_name(_name(issuer))
         .public_key(key.public_key()).serial_number(x509.random_serial_number())
         .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
         .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if ca:
        b = b.add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                          content_commitment=False, key_encipherment=False, data_encipherment=False,
                                          key_agreement=False, encipher_only=False, decipher_only=False),
                            critical=True)
        b = b.add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    else:
        b = b.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        b = b.add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()),
                            critical=False)
        if usage == ExtendedKeyUsageOID.SERVER_AUTH:
            b = b.add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                                             x509.DNSName("localhost")]), critical=False)
    return b.sign(issuer_key, hashes.SHA256())


def _write(folder: Path, name: str, cert: x509.Certificate, key) -> tuple[Path, Path]:
    crt, pem = folder / f"{name}.crt", folder / f"{name}.key"
    crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pem.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                                      serialization.NoEncryption()))
    return crt, pem


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """{"ca": ca.crt, "server": (crt, key), "client": (crt, key)}: a test CA signing a server
    certificate for 127.0.0.1 and a client certificate (ECDSA P-256, SHA-256)."""
    folder = tmp_path_factory.mktemp("pki")
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _cert("Test DICOM CA", ca_key, "Test DICOM CA", ca_key, ca=True)
    ca_file, _ = _write(folder, "ca", ca, ca_key)
    out = {"ca": ca_file}
    for name, usage in (("server", ExtendedKeyUsageOID.SERVER_AUTH), ("client", ExtendedKeyUsageOID.CLIENT_AUTH)):
        key = ec.generate_private_key(ec.SECP256R1())
        out[name] = _write(folder, name, _cert(f"{name}.test", key, "Test DICOM CA", ca_key, usage=usage), key)
    return out


# --- the listener -----------------------------------------------------------------------------

class Listener:
    def __init__(self, tmp_path: Path, pki, **settings) -> None:
        cert, key = pki["server"]
        self.settings = Settings(data_dir=tmp_path / "data", index="memory", dimse_tls_cert_file=cert,
                                 dimse_tls_key_file=key, dimse_tls_ca_file=pki["ca"], **settings)
        self.archive = Archive.open(self.settings)
        self.server = DimseServer(self.archive)
        self.port = self.server.start(host="127.0.0.1", port=0, tls_port=0)
        self.tls_port = self.server.tls_port

    def close(self) -> None:
        self.server.stop(grace=1)
        self.archive.close()

    def stored(self, sop_uid: str) -> bytes | None:
        loc = self.archive.index.locate(sop_uid)
        return None if loc is None else self.archive.blobs.resolve(loc.path).read_bytes()


@pytest.fixture
def listener(tmp_path, pki):
    made: list[Listener] = []

    def make(**settings) -> Listener:
        made.append(Listener(tmp_path / str(len(made)), pki, **settings))
        return made[-1]

    yield make
    for one in made:
        one.close()


def _ae() -> AE:
    ae = AE(ae_title="TLSSCU")
    ae.acse_timeout = ae.dimse_timeout = ae.network_timeout = 10
    ae.add_requested_context(Verification)
    ae.add_requested_context(CTImageStorage, U.ExplicitVRLittleEndian)
    return ae


def _client_args(pki, with_cert: bool):
    client = TlsClient(pki["ca"], *(pki["client"] if with_cert else (None, None)))
    return (client_context(client), "127.0.0.1")


def _data_set_bytes(part10: bytes) -> bytes:
    """The data set of a PS3.10 file: what follows the preamble, DICM and the file meta group."""
    assert part10[128:132] == b"DICM"
    (group_length,) = struct.unpack_from("<I", part10, 140)
    return part10[144 + group_length:]


def _digest(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def test_c_echo_and_c_store_over_tls(listener, pki):
    """pynetdicom over TLS: C-ECHO Success, C-STORE Success, and the data set stored is the
    one sent, byte for byte (SHA-256), read from the TLS socket by the listener's reactor
    (dimse/reactor.py: bytes already decrypted in the TLS buffer are not waited for); the session
    is TLS 1.2 or later."""
    srv = listener()
    ds = make_dataset(rows=1024, columns=1024, PatientID="TLS1")  # 2 MiB of pixels: many PDUs, TLS records
    assoc = _ae().associate("127.0.0.1", srv.tls_port, ae_title="DICOMWEB", tls_args=_client_args(pki, False))
    assert assoc.is_established
    try:
        assert assoc.dul.socket.socket.version() in ("TLSv1.2", "TLSv1.3")
        assert assoc.send_c_echo().Status == S.SUCCESS
        assert assoc.send_c_store(ds).Status == S.SUCCESS
    finally:
        assoc.release()
    stored = srv.stored(ds.SOPInstanceUID)
    assert stored is not None
    assert _digest(_data_set_bytes(stored)) == _digest(_data_set_bytes(to_bytes(ds)))


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion:DeprecationWarning")
def test_tls_1_1_is_refused(listener, pki):
    """Non-downgrading (PS3.15 B.9): a client offering at most TLS 1.1 gets no session."""
    srv = listener()
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(pki["ca"])
    try:
        ctx.minimum_version = ssl.TLSVersion.TLSv1
        ctx.maximum_version = ssl.TLSVersion.TLSv1_1
    except (ValueError, ssl.SSLError):
        pytest.skip("this OpenSSL cannot even offer TLS 1.1")
    with socket.create_connection(("127.0.0.1", srv.tls_port), timeout=10) as raw:
        with pytest.raises((ssl.SSLError, OSError)):
            ctx.wrap_socket(raw, server_hostname="127.0.0.1")


def test_client_certificate_required(listener, pki):
    """dimse_tls_require_client_cert: without a certificate the handshake fails and nothing is
    stored; with one signed by the CA the C-STORE succeeds."""
    srv = listener(dimse_tls_require_client_cert=True)
    refused, accepted = (make_dataset(rows=8, columns=8, PatientID=p) for p in ("NOCERT", "CERT"))
    assoc = _ae().associate("127.0.0.1", srv.tls_port, ae_title="DICOMWEB", tls_args=_client_args(pki, False))
    if assoc.is_established:  # (TLS 1.3: the client's handshake may end before the server checks)
        assert getattr(assoc.send_c_store(refused), "Status", None) != S.SUCCESS
    assert not assoc.is_established
    assert srv.stored(refused.SOPInstanceUID) is None

    assoc = _ae().associate("127.0.0.1", srv.tls_port, ae_title="DICOMWEB", tls_args=_client_args(pki, True))
    assert assoc.is_established
    try:
        assert assoc.send_c_store(accepted).Status == S.SUCCESS
    finally:
        assoc.release()
    assert srv.stored(accepted.SOPInstanceUID) is not None


def test_plain_client_on_the_tls_port_fails_cleanly(listener, pki):
    """A plain DICOM client on the TLS port: its association fails, nothing stored; the TLS
    port and the plain port go on serving. A client that connects and sends nothing does
    not hold the accept loop (the handshake runs in the connection's thread)."""
    srv = listener(dimse_acse_timeout=30)
    silent = socket.create_connection(("127.0.0.1", srv.tls_port))  # connects, never says a word
    start = time.monotonic()
    try:
        ds = make_dataset(rows=8, columns=8, PatientID="PLAIN")
        assoc = _ae().associate("127.0.0.1", srv.tls_port, ae_title="DICOMWEB")
        assert not assoc.is_established
        assert srv.stored(ds.SOPInstanceUID) is None
        # the plain port and the TLS port both still serve (the silent client waits its turn elsewhere)
        plain = _ae().associate("127.0.0.1", srv.port, ae_title="DICOMWEB")
        assert plain.is_established
        assert plain.send_c_store(ds).Status == S.SUCCESS
        plain.release()
        secure = _ae().associate("127.0.0.1", srv.tls_port, ae_title="DICOMWEB", tls_args=_client_args(pki, False))
        assert secure.is_established
        assert secure.send_c_echo().Status == S.SUCCESS
        secure.release()
        # not held up by the silent client (a handshake in the accept loop waited for it: 60 s)
        assert time.monotonic() - start < 5
    finally:
        silent.close()
    assert srv.stored(ds.SOPInstanceUID) is not None


def test_dcmtk_storescu_over_tls(listener, pki, tmp_path):
    """DCMTK's storescu +tls (its default profile: Non-downgrading BCP 195, PS3.15 B.9), with
    a client certificate where the listener requires one."""
    from tests.dimse.test_dcmtk import dcmtk

    srv = listener(dimse_tls_require_client_cert=True)
    ds = make_dataset(rows=16, columns=16, PatientID="DCMTKTLS")
    path = tmp_path / "ct.dcm"
    path.write_bytes(to_bytes(ds))
    crt, key = pki["client"]
    proc = subprocess.run([dcmtk("storescu"), "+tls", str(key), str(crt), "+cf", str(pki["ca"]),
                           "-aec", "DICOMWEB", "-aet", "DCMTKTLS", "127.0.0.1", str(srv.tls_port), str(path)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    stored = srv.stored(ds.SOPInstanceUID)
    assert stored is not None
    assert _digest(_data_set_bytes(stored)) == _digest(_data_set_bytes(to_bytes(ds)))


def test_both_ports_share_the_association_slots(listener, pki):
    """One node limit over both ports (dimse_max_associations = 1): an association held on the
    TLS port leaves none for the plain port (A-ASSOCIATE-RJ), and the other way round."""
    srv = listener(dimse_max_associations=1, dimse_max_associations_per_peer=1)
    held = _ae().associate("127.0.0.1", srv.tls_port, ae_title="DICOMWEB", tls_args=_client_args(pki, False))
    assert held.is_established
    try:
        other = _ae().associate("127.0.0.1", srv.port, ae_title="DICOMWEB")
        assert other.is_rejected
    finally:
        held.release()
    held = _ae().associate("127.0.0.1", srv.port, ae_title="DICOMWEB")
    assert held.is_established
    try:
        other = _ae().associate("127.0.0.1", srv.tls_port, ae_title="DICOMWEB", tls_args=_client_args(pki, False))
        assert other.is_rejected
    finally:
        held.release()


# --- the SCU side: routing C-STORE destinations and C-MOVE destinations ------------------------

def _tls_only_server(pki) -> ssl.SSLContext:
    """A peer's TLS listener context: the test CA's server certificate, client certificates required."""
    cert, key = pki["server"]
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert, key)
    ctx.load_verify_locations(pki["ca"])
    ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


@pytest.fixture
def tls_storage_scp(pki):
    """A pynetdicom Storage SCP "PACS" listening with TLS only (the test CA's server
    certificate, client certificates required); yields (port, {SOP Instance UID: data set bytes})."""
    from pynetdicom import evt

    received: dict[str, bytes] = {}

    def on_store(event):
        ds = event.dataset
        ds.file_meta = event.file_meta
        received[ds.SOPInstanceUID] = _data_set_bytes(to_bytes(ds))
        return 0x0000

    ctx = _tls_only_server(pki)
    ae = AE(ae_title="PACS")
    ae.add_supported_context(CTImageStorage, U.ExplicitVRLittleEndian)  # as stored: the same bytes back
    ae.add_supported_context(Verification)
    server = ae.start_server(("127.0.0.1", 0), block=False, ssl_context=ctx,
                             evt_handlers=[(evt.EVT_C_STORE, on_store)])
    yield server.server_address[1], received
    server.shutdown()


def _tls_fields(pki) -> str:
    crt, key = pki["client"]
    return f'tls = true, tls_ca_file = "{pki["ca"]}", tls_cert_file = "{crt}", tls_key_file = "{key}"'


def test_routing_c_store_destination_over_tls(tmp_path, pki, tls_storage_scp):
    """A routes file's dimse destination with tls = true delivers over TLS (with this archive's
    client certificate) to a TLS-only Storage SCP: the data set arrives byte for byte."""
    from tests.helpers import LiveServer
    from tests.routing.conftest import FAST, wait_for
    from tests.routing.test_delivery import queue, store

    port, received = tls_storage_scp
    routes = tmp_path / "routes.toml"
    routes.write_text(f'[[destinations]]\nname = "pacs"\ndimse = {{ ae_title = "PACS", host = "127.0.0.1", '
                      f'port = {port}, {_tls_fields(pki)} }}\n[[rules]]\ndestinations = ["pacs"]\n{FAST}')
    srv = LiveServer(tmp_path / "data", "sqlite", routes_file=routes).start()
    try:
        datasets = [make_dataset(rows=8, columns=8) for _ in range(2)]
        store(srv.url, datasets)
        wait_for(lambda: queue(srv.url)["pacs"]["delivered"] == 2, what="2 delivered over TLS")
    finally:
        srv.stop()
    assert {uid: _digest(b) for uid, b in received.items()} == {
        ds.SOPInstanceUID: _digest(_data_set_bytes(to_bytes(ds))) for ds in datasets}


def test_routing_tls_fields_are_checked_at_load(tmp_path, pki):
    """A tls_* field without tls = true, or a CA file that does not exist: refused with the
    destination named, not met at the first delivery."""
    from dicomweb_server.routing.rules import RoutesError, load_routes

    routes = tmp_path / "routes.toml"
    for fields, message in ((f'tls_ca_file = "{pki["ca"]}"', "without tls = true"),
                            (f'tls = true, tls_ca_file = "{tmp_path / "nope.crt"}"', "nope.crt")):
        routes.write_text(f'[[destinations]]\nname = "pacs"\ndimse = {{ ae_title = "PACS", host = "127.0.0.1", '
                          f'port = 104, {fields} }}\n[[rules]]\ndestinations = ["pacs"]\n')
        with pytest.raises(RoutesError, match=message):
            load_routes(routes)


def test_c_move_to_a_tls_destination(tmp_path, pki, tls_storage_scp):
    """A peer with tls = true in the peers file: the C-MOVE sub-operations go to it over TLS."""
    from pynetdicom.sop_class import StudyRootQueryRetrieveInformationModelMove
    from pydicom.dataset import Dataset

    port, received = tls_storage_scp
    peers = tmp_path / "peers.toml"
    crt, key = pki["client"]
    peers.write_text(f'[PACS]\nhost = "127.0.0.1"\nport = {port}\ntls = true\ntls_ca_file = "{pki["ca"]}"\n'
                     f'tls_cert_file = "{crt}"\ntls_key_file = "{key}"\n')
    archive = Archive.open(Settings(data_dir=tmp_path / "data", index="memory", dimse_peers_file=peers))
    server = DimseServer(archive)
    dimse_port = server.start(host="127.0.0.1", port=0)
    try:
        ds = make_dataset(rows=8, columns=8, PatientID="MOVETLS")
        ae = _ae()
        ae.add_requested_context(StudyRootQueryRetrieveInformationModelMove)
        assoc = ae.associate("127.0.0.1", dimse_port, ae_title="DICOMWEB")
        assert assoc.send_c_store(ds).Status == S.SUCCESS
        query = Dataset()
        query.QueryRetrieveLevel = "STUDY"
        query.StudyInstanceUID = ds.StudyInstanceUID
        final = list(assoc.send_c_move(query, "PACS", StudyRootQueryRetrieveInformationModelMove))[-1][0]
        assoc.release()
    finally:
        server.stop(grace=1)
        archive.close()
    assert (final.Status, final.NumberOfCompletedSuboperations) == (S.SUCCESS, 1)
    assert {uid: _digest(b) for uid, b in received.items()} == {
        ds.SOPInstanceUID: _digest(_data_set_bytes(to_bytes(ds)))}


def test_a_port_probe_is_not_a_failed_handshake(listener, pki):
    """A connection closed before its first byte (a load balancer's health check, serve's own
    check that the port listens) is not a WARNING "handshake failed" (docs/dimse.md: a WARNING
    is something to act on); a plain DICOM client on the TLS port still is. An integrator saw
    the warning at every start of a TLS listener."""
    import logging

    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = records.append  # type: ignore[method-assign]
    # a handler of its own on the listener's logger: an earlier test of this process may have
    # configured logging (levels, propagation) in a way pytest's caplog does not see through
    logger = logging.getLogger("dicomweb_server.dimse")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)

    def messages(at_least: int) -> list[str]:
        return [r.getMessage() for r in list(records) if r.levelno >= at_least and "TLS" in r.getMessage()]

    def settled(condition) -> None:
        deadline = time.monotonic() + 10
        while not condition():
            assert time.monotonic() < deadline, messages(logging.DEBUG)
            time.sleep(0.02)

    try:
        srv = listener()
        socket.create_connection(("127.0.0.1", srv.tls_port)).close()  # the probe
        settled(lambda: any("closed before sending anything" in m for m in messages(logging.DEBUG)))
        assert messages(logging.WARNING) == []
        assoc = _ae().associate("127.0.0.1", srv.tls_port, ae_title="DICOMWEB")  # plain DICOM: fails TLS
        assert not assoc.is_established
        settled(lambda: messages(logging.WARNING) != [])
        warned = messages(logging.WARNING)
        assert len(warned) == 1 and "DICOM TLS handshake with 127.0.0.1:" in warned[0], warned
        secure = _ae().associate("127.0.0.1", srv.tls_port, ae_title="DICOMWEB",
                                 tls_args=_client_args(pki, False))
        assert secure.is_established and secure.send_c_echo().Status == S.SUCCESS
        secure.release()
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def test_serve_tls_only_with_listener_processes(tmp_path, pki):
    """``dicomweb-server serve --dimse-port 0 --dimse-tls-port P`` (TLS only) with two listener
    processes: DCMTK's echoscu and storescu +tls reach it, the instance is found over QIDO-RS,
    and a plain association to that port fails."""
    import os
    import sys

    import httpx

    from tests.dimse.test_dcmtk import dcmtk
    from tests.helpers import free_port, stop_processes

    http, tport = free_port(), free_port()
    cert, key = pki["server"]
    crt, ckey = pki["client"]
    serve = subprocess.Popen(
        [sys.executable, "-m", "dicomweb_server.cli", "serve", "--data-dir", str(tmp_path / "data"),
         "--port", str(http), "--dimse-port", "0", "--dimse-tls-port", str(tport), "--dimse-processes", "2",
         "--dimse-tls-cert-file", str(cert), "--dimse-tls-key-file", str(key), "--dimse-tls-ca-file", str(pki["ca"]),
         "--dimse-tls-require-client-cert", "--workers", "1"],
        env={**os.environ, "DICOMWEB_LOG_LEVEL": "warning"}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    tls_args = ["+tls", str(ckey), str(crt), "+cf", str(pki["ca"]), "-aec", "DICOMWEB"]
    try:
        deadline = time.monotonic() + 60
        while subprocess.run([dcmtk("echoscu"), *tls_args, "127.0.0.1", str(tport)],
                             check=False, capture_output=True).returncode != 0:  # C-ECHO over TLS: up
            assert serve.poll() is None and time.monotonic() < deadline
            time.sleep(0.3)
        ds = make_dataset(rows=8, columns=8, PatientID="SERVETLS")
        path = tmp_path / "ct.dcm"
        path.write_bytes(to_bytes(ds))
        for _ in range(4):  # the kernel spreads the connections over both processes (SO_REUSEPORT)
            proc = subprocess.run([dcmtk("storescu"), *tls_args, "127.0.0.1", str(tport), str(path)],
                                  capture_output=True, text=True, timeout=60, check=False)
            assert proc.returncode == 0, proc.stdout + proc.stderr
        assert not _ae().associate("127.0.0.1", tport, ae_title="DICOMWEB").is_established
        hits = httpx.get(f"http://127.0.0.1:{http}/instances", params={"PatientID": "SERVETLS"}, timeout=30).json()
        assert [h["00080018"]["Value"][0] for h in hits] == [ds.SOPInstanceUID]
        landing = httpx.get(f"http://127.0.0.1:{http}/", timeout=30).json()  # what the landing page claims
        assert (landing["dimse_port"], landing["dimse_tls_port"]) == (0, tport)
        page = httpx.get(f"http://127.0.0.1:{http}/", headers={"Accept": "text/html"}, timeout=30).text
        assert f"DICOM TLS (DIMSE) on port {tport}" in page and "DICOM (DIMSE) on port" not in page
    finally:
        stop_processes([serve])


def test_serve_refuses_a_certificate_that_does_not_load(tmp_path, pki):
    """A key given as the certificate: serve exits 2 at start with one line naming the files."""
    import sys

    _, key = pki["server"]
    proc = subprocess.run(
        [sys.executable, "-m", "dicomweb_server.cli", "serve", "--data-dir", str(tmp_path / "data"), "--port", "0",
         "--dimse-tls-port", "2762", "--dimse-tls-cert-file", str(key), "--dimse-tls-key-file", str(key)],
        capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2
    assert f"--dimse-tls-port: TLS certificate {key}, key {key}: " in proc.stderr


def test_commitment_report_on_a_new_tls_association(tmp_path, pki):
    """Storage commitment (PS3.4 J.3.3): the requester (pynetdicom) releases its association at
    once and listens for the report with TLS only, client certificates required; its peers
    entry says tls = true: the N-EVENT-REPORT comes on a new association over TLS (the
    archive's client certificate), Event Type 1. Before, that association was plain TCP: the
    handshake never happened and the report was retried until it died."""
    import threading

    from pydicom.dataset import Dataset
    from pynetdicom import evt
    from pynetdicom.sop_class import StorageCommitmentPushModel, StorageCommitmentPushModelInstance

    from dicomweb_server.dimse.commitment import REQUEST_STORAGE_COMMITMENT

    reports: list = []
    arrived = threading.Event()

    def on_report(event):
        sock = event.assoc.dul.socket.socket
        reports.append((event.event_type, event.event_information, isinstance(sock, ssl.SSLSocket)))
        arrived.set()
        return 0x0000, None

    modality = AE(ae_title="MODALITY")
    modality.add_supported_context(StorageCommitmentPushModel, scu_role=False, scp_role=True)
    scp = modality.start_server(("127.0.0.1", 0), block=False, ssl_context=_tls_only_server(pki),
                                evt_handlers=[(evt.EVT_N_EVENT_REPORT, on_report)])
    peers = tmp_path / "peers.toml"
    peers.write_text(f'[MODALITY]\nhost = "127.0.0.1"\nport = {scp.server_address[1]}\n{_tls_fields(pki).replace(", ", chr(10))}\n')
    archive = Archive.open(Settings(data_dir=tmp_path / "data", index="memory", dimse_peers_file=peers,
                                    dimse_commitment_retry=0.2))
    server = DimseServer(archive)
    port = server.start(host="127.0.0.1", port=0)
    try:
        ds = make_dataset(rows=8, columns=8, PatientID="COMMITTLS")
        ae = AE(ae_title="MODALITY")
        ae.add_requested_context(CTImageStorage, U.ExplicitVRLittleEndian)
        ae.add_requested_context(StorageCommitmentPushModel)
        assoc = ae.associate("127.0.0.1", port, ae_title="DICOMWEB")
        assert assoc.send_c_store(ds).Status == S.SUCCESS
        request = Dataset()
        request.TransactionUID = "1.2.3.4.5"
        item = Dataset()
        item.ReferencedSOPClassUID = ds.SOPClassUID
        item.ReferencedSOPInstanceUID = ds.SOPInstanceUID
        request.ReferencedSOPSequence = [item]
        status, _ = assoc.send_n_action(request, REQUEST_STORAGE_COMMITMENT, StorageCommitmentPushModel,
                                        StorageCommitmentPushModelInstance)
        assert status.Status == S.SUCCESS
        assoc.release()  # at once: the report goes on a new association
        assert arrived.wait(20), "no N-EVENT-REPORT over TLS"
    finally:
        server.stop(grace=1)
        archive.close()
        scp.shutdown()
    [(event_type, info, over_tls)] = reports
    assert (event_type, over_tls, info.TransactionUID) == (1, True, "1.2.3.4.5")
    assert [str(i.ReferencedSOPInstanceUID) for i in info.ReferencedSOPSequence] == [str(ds.SOPInstanceUID)]


def test_pull_over_tls(tmp_path, pki, listener):
    """A pull (dimse/pull.py) from a remote that speaks TLS only and requires a client
    certificate (this project's listener): the C-FIND and the C-GET go over TLS with the
    archive's client certificate, the study arrives byte for byte (pixel data SHA-256)."""
    from dicomweb_server.jobs import run_inline

    remote = listener(dimse_tls_require_client_cert=True)
    datasets = [make_dataset(rows=32, columns=32, PatientID="PULLTLS") for _ in range(2)]
    for ds in datasets:
        assoc = _ae().associate("127.0.0.1", remote.tls_port, ae_title="DICOMWEB", tls_args=_client_args(pki, True))
        assert assoc.send_c_store(ds).Status == S.SUCCESS
        assoc.release()
    peers = tmp_path / "puller-peers.toml"
    peers.write_text(f'[DICOMWEB]\nhost = "127.0.0.1"\nport = {remote.tls_port}\nretrieve_method = "C-GET"\n'
                     + _tls_fields(pki).replace(", ", "\n") + "\n")
    archive = Archive.open(Settings(data_dir=tmp_path / "puller", index="memory", ae_title="PULLER",
                                    dimse_peers_file=peers))
    try:
        result, _ = run_inline("pull", {"from": "DICOMWEB", "query": {"PatientID": "PULLTLS"}}, archive)
        got = {}
        for ds in datasets:
            loc = archive.index.locate(str(ds.SOPInstanceUID))
            got[loc.sop_uid] = _digest(pydicom.dcmread(archive.blobs.resolve(loc.path)).PixelData)
    finally:
        archive.close()
    assert (result["pulled"], result["instances"]["completed"], result["failed"]) == (2, 2, 0)  # 2 studies
    assert got == {str(d.SOPInstanceUID): _digest(d.PixelData) for d in datasets}
