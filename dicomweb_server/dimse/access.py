"""Who may do what over DIMSE: the same door as HTTP.

AE titles are not credentials: any program can send any calling AE title. So when HTTP
requires credentials (API keys, basic users or OIDC configured: ``Settings.auth_configured``),
the DIMSE listener serves only the peers of the peers file (:mod:`.peers`), each from its
own address, each within its scopes:

- an A-ASSOCIATE-RQ whose calling AE title is not in the peers file, or that does not come
  from the address of that peer's ``host``, is rejected: A-ASSOCIATE-RJ, rejected-permanent,
  DUL service-user, "calling-AE-title-not-recognized" (PS3.8 §7.1.1.9, Table 9-21);
- on an accepted association, every DIMSE request goes through one check,
  :meth:`AccessPolicy.authorize`, before any service runs: C-ECHO needs no scope, C-STORE
  the ``write`` scope, C-FIND (Modality Worklist too), C-GET and C-MOVE the ``read`` scope,
  N-ACTION (Storage Commitment, :mod:`.commitment`), N-CREATE and N-SET (Modality Performed
  Procedure Step, :mod:`.mpps`) the ``write`` scope, and any other service
  (none is offered today: a service added later) is refused until it is given a scope in
  :data:`SERVICE_SCOPES`. A request refused is answered by its response with status 0x0124
  "Refused: Not Authorized" (PS3.7 Annex C, a general status every DIMSE-C and DIMSE-N
  response may carry; PS3.4 has no service-specific one), without counts or data set; a
  C-STORE's received data set is deleted.

The check runs where pynetdicom dispatches a request to its service class
(``Association._serve_request``, replaced while the listener runs: :func:`install`), not in
the handlers: a handler bound later for a new service cannot forget it.

Without authentication configured nothing changes: every AE title is served everything (the
HTTP rule, ``cli.py``: beyond loopback, the server then starts only with ``--insecure``).

The identity of an association is an :class:`~dicomweb_server.identity.Identity` (the type
HTTP requests carry: subject = calling AE title, the peer's scopes, method ``dimse-peer``, or
``anonymous`` without authentication), kept on the association (:func:`identity_of`): the
hook for access rules by label later, the same object for both front doors.

Each decision is written to the audit log (``dicomweb_server.audit``, JSON lines, the file of
``--audit-log``) as HTTP writes one per request: the association's acceptance or rejection,
and, with an audit log configured, each request with its service, the peer and the outcome.
A refusal is also logged as a warning.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import threading
import time
from io import BytesIO
from pathlib import Path

import orjson

from ..identity import SCOPES, Identity
from ..settings import Settings
from . import status as S
from .peers import Peer

log = logging.getLogger("dicomweb_server.dimse")
audit_log = logging.getLogger("dicomweb_server.audit")

#: DIMSE service -> the scope it needs (None: any peer allowed to associate); a service not
#: listed is refused when authentication is configured
SERVICE_SCOPES: dict[str, str | None] = {
    "C-ECHO": None, "C-STORE": "write", "C-FIND": "read", "C-GET": "read", "C-MOVE": "read",
    "N-ACTION": "write",  # Storage Commitment (commitment.py): asked by who stored the instances
    "N-CREATE": "write", "N-SET": "write",  # Modality Performed Procedure Step (mpps.py): a modality's report
}
_ACTIONS = {"C-ECHO": "echo", "C-STORE": "store", "C-FIND": "search", "C-GET": "retrieve", "C-MOVE": "retrieve",
            "N-ACTION": "commit", "N-CREATE": "perform", "N-SET": "perform"}

#: seconds a resolved peer host name is kept
RESOLVE_TTL = 60.0


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        ip = ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped  # ::ffff:10.0.0.5 on a dual-stack socket is 10.0.0.5
    return ip


class AccessPolicy:
    """The access decisions of one listener (module docstring)."""

    def __init__(self, settings: Settings, peers: dict[str, Peer]) -> None:
        self.required = settings.auth_configured()
        self.audit_requests = settings.audit_log is not None
        self.peers = peers
        self._resolved: dict[str, tuple[float, frozenset]] = {}
        self._lock = threading.Lock()

    # --- decisions ------------------------------------------------------------------------

    def identify(self, calling_ae: str, address: str) -> tuple[Identity | None, str]:
        """The identity of an association from ``address`` calling itself ``calling_ae``, or
        None and why it is refused."""
        ae = calling_ae.strip()
        if not self.required:
            return Identity(ae, frozenset(SCOPES), "anonymous"), "no authentication configured"
        peer = self.peers.get(ae)
        if peer is None:
            return None, f"calling AE title {ae!r} is not in the peers file"
        ip = _address(address)
        if ip is None or ip not in self._addresses(peer.host):
            return None, f"calling AE title {ae!r} from {address}, not from its host {peer.host!r}"
        return Identity(ae, peer.scopes, "dimse-peer"), f"peer {ae!r} from {address}"

    def authorize(self, identity: Identity | None, service: str) -> str | None:
        """None when ``identity`` may use ``service`` (``"C-FIND"``...), else why not."""
        if not self.required:
            return None
        if identity is None:
            return "no identity"
        if service not in SERVICE_SCOPES:
            return f"{service} is not a service peers are authorized for"
        need = SERVICE_SCOPES[service]
        if need is not None and need not in identity.scopes:
            return f"{service} needs the {need!r} scope, which peer {identity.subject!r} lacks"
        return None

    def _addresses(self, host: str) -> frozenset:
        """The addresses of a peer's ``host`` (an address, or a name resolved at most every
        ``RESOLVE_TTL`` seconds); empty when it does not resolve."""
        ip = _address(host)
        if ip is not None:
            return frozenset([ip])
        now = time.monotonic()
        with self._lock:
            hit = self._resolved.get(host)
        if hit is not None and hit[0] > now:
            return hit[1]
        try:
            infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
            found = frozenset(a for a in (_address(str(i[4][0])) for i in infos) if a is not None)
        except OSError as e:
            log.warning("DIMSE peer host %r does not resolve: %s", host, e)
            found = frozenset()
        with self._lock:
            self._resolved[host] = (now + RESOLVE_TTL, found)
        return found

    # --- the association: EVT_REQUESTED ---------------------------------------------------

    def on_requested(self, event) -> None:
        """Bound to ``EVT_REQUESTED`` (the A-ASSOCIATE-RQ received, nothing negotiated yet):
        the association's identity, or the A-ASSOCIATE-RJ."""
        assoc = event.assoc
        rq = assoc.requestor.primitive
        calling, called = _text(rq.calling_ae_title), _text(rq.called_ae_title)
        address = str(assoc.requestor.address)
        identity, why = self.identify(calling, address)
        assoc.dicomweb_identity = identity
        if identity is not None:
            if self.required:
                self._audit("associate", "A-ASSOCIATE", identity, calling, called, address, "allowed", why)
            return
        log.warning("DIMSE association from %s rejected: %s", address, why)
        self._audit("associate", "A-ASSOCIATE", None, calling, called, address, "rejected", why, always=True)
        # as pynetdicom rejects a calling AE title not in require_calling_aet (acse.py)
        assoc.acse.send_reject(0x01, 0x01, 0x03)
        assoc.kill()

    # --- each request: Association._serve_request -----------------------------------------

    def check_request(self, assoc, msg, context_id: int) -> bool:
        """True when the request may be served; else it is answered 0x0124 here."""
        if not (self.required or self.audit_requests):  # the default: nothing to decide or write
            return True
        service = type(msg).__name__.replace("_", "-")
        identity = getattr(assoc, "dicomweb_identity", None)
        why = self.authorize(identity, service)
        if why is None and not self.audit_requests:
            return True
        requestor = assoc.requestor
        record = _request_details(assoc, msg, context_id, service) if self.audit_requests else {}
        self._audit(_ACTIONS.get(service, service.lower()), service, identity, _text(requestor.ae_title),
                    _text(assoc.acceptor.ae_title), str(requestor.address),
                    "allowed" if why is None else "refused", why, always=why is not None, **record)
        if why is None:
            return True
        log.warning("DIMSE %s from %s (%s) refused: %s", service, _text(requestor.ae_title), requestor.address, why)
        _refuse(assoc, msg, context_id, why)
        return False

    # --- audit ----------------------------------------------------------------------------

    def _audit(self, action: str, service: str, identity: Identity | None, calling: str, called: str,
               address: str, outcome: str, why: str | None, always: bool = False, **details) -> None:
        """One JSON line, the fields of an HTTP audit record where they mean the same
        (``api/auth.py``: time, action, user, auth, client, outcome)."""
        if not (always or self.audit_requests):
            return
        record = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + f".{int(time.time() * 1000) % 1000:03d}Z",
            "event": "requested" if action == "associate" else "request",  # (scp.py: accepted, released...)
            "protocol": "DIMSE",
            "action": action,
            "service": service,
            "user": identity.subject if identity else None,
            "auth": identity.method if identity else None,
            "client": address,
            "calling_ae": calling,
            "called_ae": called,
            **details,
            "outcome": outcome,
        }
        if why and outcome != "allowed":
            record["reason"] = why
        audit_log.info(orjson.dumps(record).decode())


def identity_of(assoc) -> Identity | None:
    """The identity the listener gave an association (module docstring), for handlers."""
    return getattr(assoc, "dicomweb_identity", None)


def _text(value) -> str:
    if isinstance(value, bytes):
        value = value.decode("ascii", "replace")
    return str(value or "").strip()


def _request_details(assoc, msg, context_id: int, service: str) -> dict:
    """What an audit record says about a request: SOP class, and the instance (C-STORE) or the
    Query/Retrieve level and study of the identifier (C-FIND/C-GET/C-MOVE), the destination
    of a C-MOVE."""
    out: dict = {"sop_class": str(getattr(msg, "AffectedSOPClassUID", None)
                                  or getattr(msg, "RequestedSOPClassUID", None) or "") or None}
    if service == "C-STORE":
        out["sop_instance"] = str(msg.AffectedSOPInstanceUID or "") or None
    if service == "C-MOVE":
        out["move_destination"] = _text(msg.MoveDestination)
    identifier = getattr(msg, "Identifier", None)
    if service in ("C-FIND", "C-GET", "C-MOVE") and isinstance(identifier, BytesIO):
        try:
            from .find import parsed_identifier  # bounded: not pynetdicom's decode (find.py)

            ds = parsed_identifier(identifier, assoc._accepted_cx[context_id].transfer_syntax[0])
            out["level"] = str(ds.get("QueryRetrieveLevel", "")) or None
            out["study"] = str(ds.get("StudyInstanceUID", "")) or None
        except Exception:  # noqa: BLE001 - the service names what is wrong with it
            pass
    return out


def _refuse(assoc, msg, context_id: int, why: str, status: int = S.NOT_AUTHORIZED) -> None:
    """Answer ``msg`` with ``status`` (0x0124 unless told) and nothing else (PS3.7 Annex C)."""
    rsp = type(msg)()
    rsp.MessageIDBeingRespondedTo = msg.MessageID
    sop_class = getattr(msg, "AffectedSOPClassUID", None) or getattr(msg, "RequestedSOPClassUID", None)
    if sop_class:
        rsp.AffectedSOPClassUID = sop_class
    sop_uid = getattr(msg, "AffectedSOPInstanceUID", None) or getattr(msg, "RequestedSOPInstanceUID", None)
    if sop_uid and hasattr(rsp, "AffectedSOPInstanceUID"):
        rsp.AffectedSOPInstanceUID = sop_uid
    rsp.Status = status
    rsp.ErrorComment = why.encode("ascii", "replace").decode()[:64]
    path = getattr(msg, "_dataset_path", None)  # a C-STORE's data set, received into the spool folder
    if path is not None:
        try:
            Path(path).unlink(missing_ok=True)
        except OSError as e:
            log.warning("cannot remove the refused data set %s: %s", path, e)
    assoc.dimse.send_msg(rsp, context_id)


# --- the dispatch hook ---------------------------------------------------------------------


def context_mismatch(assoc, msg, context_id: int) -> str | None:
    """Why ``msg`` may not be served on presentation context ``context_id``, or None.

    A presentation context is the SOP class the peers agreed to use it for (PS3.8 7.1.1.13:
    its Abstract Syntax Name): the request's Affected (or Requested) SOP Class UID must be
    that abstract syntax, or a Related General SOP Class of it agreed by SOP Class Common
    Extended Negotiation (PS3.7 D.3.3.6, PS3.4 B.3.1.4). pynetdicom chooses the service by
    the request's SOP class alone, so a C-ECHO on a CT Image Storage context was answered
    Success and a C-STORE of an MR instance on it stored. Refused with 0x0122 (PS3.7 Annex C:
    Refused: SOP Class Not Supported), the association going on."""
    cx = assoc._accepted_cx.get(context_id)
    sop_class = getattr(msg, "AffectedSOPClassUID", None) or getattr(msg, "RequestedSOPClassUID", None)
    if cx is None or not sop_class or str(sop_class) == str(cx.abstract_syntax):
        return None
    extended = getattr(assoc.acceptor, "accepted_common_extended", None) or {}
    related = extended.get(str(sop_class))
    if related is not None and str(cx.abstract_syntax) in {str(u) for u in related[1] or []}:
        return None
    return f"SOP Class {str(sop_class)[:24]} not of context {context_id}"

_serve_request = None  # pynetdicom's, while installed (pynetdicom is imported by the listener only)


def _serve_request_checked(self, msg, context_id: int) -> None:
    """``Association._serve_request`` behind :func:`context_mismatch` and
    :meth:`AccessPolicy.check_request` for the associations of a listener with a policy (``ae.dicomweb_access``); others (a test's
    own Storage SCP, C-MOVE sub-operation associations) as pynetdicom does."""
    policy = getattr(self.ae, "dicomweb_access", None)
    if policy is not None and self.is_acceptor and getattr(msg, "is_valid_request", False) \
            and not self._sent_release and context_id in self._accepted_cx:
        why = context_mismatch(self, msg, context_id)
        if why is not None:
            log.warning("DIMSE %s from %s refused: %s", type(msg).__name__.replace("_", "-"),
                        _text(self.requestor.ae_title), why)
            _refuse(self, msg, context_id, why, S.SOP_CLASS_NOT_SUPPORTED)
            return
        if not policy.check_request(self, msg, context_id):
            return
    try:
        _serve_request(self, msg, context_id)  # type: ignore[misc]
    finally:
        from .reactor import served_off_thread  # (pynetdicom: imported by the listener only)

        served_off_thread(self)  # an N-EVENT-REPORT served in pynetdicom's own thread


def install() -> None:
    global _serve_request
    from pynetdicom.association import Association

    if _serve_request is None:
        _serve_request = Association._serve_request
    Association._serve_request = _serve_request_checked  # type: ignore[method-assign]


def uninstall() -> None:
    from pynetdicom.association import Association

    if _serve_request is not None:
        Association._serve_request = _serve_request  # type: ignore[method-assign]


def startup_warnings(settings: Settings, peers: dict[str, Peer]) -> list[str]:
    """What ``serve`` says at start about who may use DIMSE (one line each), when DIMSE is on."""
    if not settings.dimse_on():
        return []
    ports = " and ".join(str(p) for p in (settings.dimse_port, settings.dimse_tls_port) if p)
    where = f"DIMSE {settings.ae_title} at {settings.host}:{ports}"
    if not settings.auth_configured():
        if settings.insecure:
            return [f"WARNING: {where} serves any AE title everything (C-STORE, C-FIND, C-GET, C-MOVE): "
                    "no authentication is configured and --insecure was given"]
        return []
    if not peers:
        return [f"WARNING: {where} rejects every association: authentication is configured and no "
                "--dimse-peers-file names the AE titles allowed, with their host and scopes "
                "(AE titles are not credentials); or turn DIMSE off with --dimse-port 0"]
    if not any(p.scopes for p in peers.values()):
        return [f"WARNING: {where} serves only C-ECHO: authentication is configured and no peer in "
                f"{settings.dimse_peers_file} has a scope (\"read\": C-FIND/C-GET/C-MOVE, \"write\": C-STORE)"]
    return []
