"""DICOM over TLS (PS3.15 Annex B, Secure Transport Connection Profiles): the
:class:`ssl.SSLContext` of the TLS listener port and of the SCU side (C-STORE routing
destinations, C-MOVE destinations).

Both follow the Non-downgrading BCP 195 TLS Secure Transport Connection Profile
(PS3.15 B.9; DCMTK's default ``+py``): TLS 1.2 or later only, never an older version
(RFC 8996), TLS 1.2 restricted to the AEAD cipher suites with forward secrecy that
BCP 195 (RFC 9325 §4.2) recommends; TLS 1.3 with OpenSSL's suites. The peer's
certificate is checked against the CA file given (PS3.15 B.1: each side may
authenticate the other with X.509 certificates); a listener with
``dimse_tls_require_client_cert`` refuses a client without one signed by its CA.

A peer (peers file) or a routing destination says ``tls = true``, with optional
``tls_ca_file`` (the CA that signed the peer's certificate; default: the system's),
``tls_cert_file`` and ``tls_key_file`` (this archive's client certificate, for a peer
that requires one): :func:`parse_client` reads them, :func:`client_context` builds the
context.
"""

from __future__ import annotations

import socket
import ssl
from dataclasses import dataclass
from pathlib import Path

#: TLS 1.2 cipher suites of BCP 195 (RFC 9325 §4.2), as PS3.15 B.9 requires; ECDSA or RSA
#: certificates. (TLS 1.3 suites are OpenSSL's own: all AEAD with forward secrecy.)
BCP195_TLS12_CIPHERS = ":".join((
    "ECDHE-ECDSA-AES128-GCM-SHA256", "ECDHE-RSA-AES128-GCM-SHA256",
    "ECDHE-ECDSA-AES256-GCM-SHA384", "ECDHE-RSA-AES256-GCM-SHA384",
    "DHE-RSA-AES128-GCM-SHA256", "DHE-RSA-AES256-GCM-SHA384",
))


class TlsError(ValueError):
    """A TLS setting cannot be used (a file missing or not a certificate/key)."""


def _profile(ctx: ssl.SSLContext) -> ssl.SSLContext:
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2  # non-downgrading: nothing older (PS3.15 B.9, RFC 8996)
    ctx.set_ciphers(BCP195_TLS12_CIPHERS)
    ctx.options |= ssl.OP_NO_COMPRESSION | ssl.OP_NO_RENEGOTIATION
    return ctx


def server_context(cert_file: Path, key_file: Path, ca_file: Path | None = None,
                   require_client_cert: bool = False) -> ssl.SSLContext:
    """The TLS listener's context: its certificate and key; with ``ca_file``, client
    certificates signed by that CA are verified when given (``require_client_cert``: a
    client without one fails the handshake, before any A-ASSOCIATE-RQ)."""
    ctx = _profile(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER))
    try:
        ctx.load_cert_chain(cert_file, key_file)
        if ca_file is not None:
            ctx.load_verify_locations(cafile=ca_file)
    except (OSError, ssl.SSLError) as e:
        raise TlsError(f"TLS certificate {cert_file}, key {key_file}"
                       f"{f', CA {ca_file}' if ca_file else ''}: {e}") from None
    if require_client_cert:
        if ca_file is None:
            raise TlsError("a client certificate can be required only with a CA file to check it against")
        ctx.verify_mode = ssl.CERT_REQUIRED
    elif ca_file is not None:
        ctx.verify_mode = ssl.CERT_OPTIONAL
    return ctx


@dataclass(frozen=True, slots=True)
class TlsClient:
    """How this archive connects to a peer over TLS (the peers file, the routes file)."""

    ca_file: Path | None = None  # the CA of the peer's certificate; None: the system's CAs
    cert_file: Path | None = None  # this archive's client certificate (with key_file)
    key_file: Path | None = None


#: the keys a peer or a routing destination may hold for TLS
TLS_KEYS = ("tls", "tls_ca_file", "tls_cert_file", "tls_key_file")


def parse_client(entry: dict) -> TlsClient | None:
    """The :class:`TlsClient` of a peer / destination table (``tls = true`` and the optional
    files), None without ``tls``; :class:`TlsError` for a malformed one."""
    tls = entry.get("tls", False)
    if not isinstance(tls, bool):
        raise TlsError(f"tls must be true or false, not {tls!r}")
    files = {k: entry.get(k) for k in TLS_KEYS[1:]}
    for k, v in files.items():
        if v is not None and (not isinstance(v, str) or not v.strip()):
            raise TlsError(f"{k} must be a file path, not {v!r}")
    if not tls:
        if given := [k for k, v in files.items() if v is not None]:
            raise TlsError(f"{', '.join(given)} given without tls = true")
        return None
    if (files["tls_cert_file"] is None) != (files["tls_key_file"] is None):
        raise TlsError("tls_cert_file and tls_key_file go together (a client certificate and its key)")
    client = TlsClient(*(Path(files[k]) if files[k] else None for k in TLS_KEYS[1:]))
    client_context(client)  # the files exist and load: refused at start, not at the first delivery
    return client


def client_context(client: TlsClient) -> ssl.SSLContext:
    """The SCU's context: the peer's certificate verified (against ``ca_file``, or the
    system's CAs) and its host name checked; this archive's certificate when given."""
    ctx = _profile(ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT))  # CERT_REQUIRED, check_hostname
    try:
        if client.ca_file is not None:
            ctx.load_verify_locations(cafile=client.ca_file)
        else:
            ctx.load_default_certs()
        if client.cert_file is not None:
            ctx.load_cert_chain(client.cert_file, client.key_file)
    except (OSError, ssl.SSLError) as e:
        raise TlsError(f"TLS files {', '.join(str(p) for p in (client.ca_file, client.cert_file, client.key_file) if p)}"
                       f": {e}") from None
    return ctx


def tls_args(client: TlsClient | None, host: str) -> tuple[ssl.SSLContext, str] | None:
    """``AE.associate(..., tls_args=...)``: the context and the name the peer's certificate
    must hold (its host in the peers / routes file); None for a plain connection."""
    return None if client is None else (client_context(client), host)


#: :func:`handshake`'s answer for a connection closed before it sent a byte: a port probe
#: (a load balancer's health check, ``serve``'s own check that the port listens), not a client
#: that failed TLS
CLOSED_SILENTLY = "closed before sending anything"


def handshake(sock: socket.socket, timeout: float) -> str | None:
    """Complete the server side of the TLS handshake of an accepted connection within
    ``timeout`` s, in the connection's own thread (pynetdicom's ``get_request`` does it in the
    accept loop: one client that connects and sends nothing, or plain DICOM, held the port
    for every other). None when done, else why it failed (the caller closes the socket):
    :data:`CLOSED_SILENTLY` for a connection closed before its first byte."""
    if not isinstance(sock, ssl.SSLSocket):
        return None
    before = sock.gettimeout()
    try:
        sock.settimeout(timeout)
        # peek at the plain socket (SSLSocket.recv refuses flags): nothing at all before the
        # end of the stream is a probe, not a handshake that failed
        if socket.socket.recv(sock, 1, socket.MSG_PEEK) == b"":
            return CLOSED_SILENTLY
        sock.do_handshake()
    except (OSError, ValueError) as e:  # ssl.SSLError, a timeout, a reset
        return f"{type(e).__name__}: {e}"
    finally:
        try:
            sock.settimeout(before)
        except OSError:
            pass
    return None
