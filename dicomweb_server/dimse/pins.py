"""The pynetdicom internals this package replaces or relies on, pinned (issue 33).

:mod:`.scp`, :mod:`.reactor`, :mod:`.pdata`, :mod:`.slots`, :mod:`.access` and :mod:`.store_rsp`
replace methods of pynetdicom's classes process-wide and rebind names its modules
look up at call time (``dimse_messages.create_file_meta``, ``transport.deepcopy``,
...). Each replacement copies or depends on the exact code of the function it
replaces or of the function that calls the rebound name. pyproject.toml pins the
minor version these were written against (``pynetdicom~=3.0.4``: >= 3.0.4, < 3.1);
:data:`PINNED` holds a hash of each such function's source as that version has it, so
that a new pynetdicom release (or a local edit of its files) that changes one of them
fails ``tests/dimse/test_pins.py`` naming the function and our module to review,
instead of changing behaviour silently. At start, a listener whose installed pynetdicom
is outside the tested range logs an error naming the functions that changed
(:func:`check_installed`), and serves on.

The source is read from the module's file (:func:`ast.get_source_segment`), not
from the live object: the live attribute is our replacement once a listener ran.

Every internal, who owns the change, and why (``tests/dimse/test_pins.py`` checks that this
table names each entry of :data:`PINNED`, :data:`ABSENT` and :data:`REBOUND` with its module):

================================================== ============ ==========================================
pynetdicom internal                                ours         why
================================================== ============ ==========================================
*replaced*
association.Association.__init__                   reactor.py   wrapped: a wake-up Event, and a put on the
                                                                DUL's and DIMSE's queues wakes the thread
                                                                that waits on them (no 1 ms polling)
association.Association._run_reactor               reactor.py   rewritten: blocks on that Event; fixes the
                                                                pause race that took send_c_store's answer
association.Association.kill                       reactor.py   joins the DUL thread (was 10 ms polls)
dul.DULServiceProvider.run_reactor                 reactor.py   rewritten: select() on the socket and a
                                                                wake-up pipe, timeout only for ARTIM
dul.DULServiceProvider.kill_dul                    reactor.py   wakes the DUL thread's select()
dul.DULServiceProvider.send_pdu                    reactor.py   wrapped: at most 4 P-DATA queued per sender
                                                                (a file sent by C-GET/C-MOVE was read into
                                                                memory faster than the socket took it)
transport.AssociationSocket._create_socket         reactor.py   wrapped: TCP_NODELAY on requestor sockets
association.Association.send_c_store               scp.py       retrieve_scp._send_c_store_from_file: a
                                                                sub-operation sent from the stored file
transport.AssociationSocket.recv                   scp.py       one buffer per PDU; bounded in length
                                                                (dimse_max_pdu) and in time (slow peers)
transport.AssociationServer.server_bind            scp.py       wrapped: SO_REUSEPORT for serve's listener
                                                                processes (pynetdicom ignores
                                                                allow_reuse_port)
transport.AssociationServer.get_request            scp.py       per server: TCP_NODELAY, the network timeout
                                                                on accepted sockets, the TLS handshake in
                                                                the connection's thread, not the accept loop
dimse_messages.DIMSEMessage.encode_msg             scp.py       wrapped: PDUs sent capped at SEND_PDU_MAX
dul.DULServiceProvider._read_pdu_data              pdata.py     P-DATA-TF as views of one buffer (4 copies
                                                                of each data set before)
dimse.DIMSEServiceProvider.receive_primitive       pdata.py     PDV by PDV, message assembly rules checked
                                                                (PS3.8 §9.3.5, Annex E)
dimse.DIMSEServiceProvider.send_msg                store_rsp.py the C-STORE-RSP encoded by hand (19 % of the
                                                                listener's GIL samples); one message at a
                                                                time on an association, whatever thread
                                                                sends (PS3.7 §6.3.1)
association.Association._serve_request             access.py    the DIMSE access check before every service
*added where pynetdicom has none* (:data:`ABSENT`)
association.Association.run                        slots.py     a thread's end rewrites its slot row
transport.AssociationServer.verify_request         slots.py     the node's connection bounds at accept
*relied on*
dimse_messages.DIMSEMessage.decode_msg             scp.py       calls NamedTemporaryFile, create_file_meta,
                                                                write_file_meta_info, which scp.py rebinds:
                                                                C-STORE data sets streamed into the spool
transport.RequestHandler._create_association       scp.py       calls deepcopy (rebound: the contexts are
                                                                shared, not copied); names AcceptorThread
dsutils.create_file_meta                           scp.py       _encoded_file_meta writes the same bytes
transport.AssociationServer.active_associations    slots.py     a process's slots are read from its
                                                                AcceptorThread threads
transport.ThreadedAssociationServer.process_request_thread
                                                   slots.py     connections not yet associations are its
                                                                threads; scp.py wraps its finish_request
                                                                for the TLS handshake
acse.ACSE.send_reject                              slots.py     A-ASSOCIATE-RJ local-limit-exceeded from
                                                                EVT_REQUESTED
dul.DULServiceProvider._is_transport_event         reactor.py   called by the rewritten DUL loop, as
                                                                pynetdicom's loop does
dul.DULServiceProvider._process_recv_primitive     reactor.py   likewise
service_class.StorageServiceClass.SCP              cstore_rx.py done on the DUL thread for a C-STORE the
                                                                archive's path takes: the response built
                                                                as it builds it, the spool name removed
service_class.ServiceClass.validate_status         cstore_rx.py Status and Error Comment of the handler's
                                                                result set as it sets them
dimse_messages.DIMSEMessage.message_to_primitive   cstore_rx.py the C-STORE primitive made from the command
                                                                elements through the same setters
transport.AssociationSocket.send                   cstore_rx.py sends the C-STORE-RSP PDU from the DUL
                                                                thread (Evt17 if the connection failed)
fsm.DT_1                                           cstore_rx.py what it does for that P-DATA (Sta6 -> Sta6)
                                                                is done without the state machine
sop_class.uid_to_service_class                     cstore_rx.py only storage SOP classes take the path
presentation.negotiate_as_acceptor
                                                   negotiation.py its answer amended: the requestor's
                                                                order of transfer syntaxes (dimse.md)
acse.ACSE._negotiate_as_acceptor                   negotiation.py calls the name negotiation.install()
                                                                rebinds in acse
service_class.QueryRetrieveServiceClass._move_scp
                                                   retrieve_scp.py associates with the C-MOVE destination
                                                                through the listener's AE.associate, reads
                                                                only is_established and release of it
                                                                before a final failure: a refused C-MOVE
                                                                gets _NotAssociated (no connection)
*module attributes rebound* (:data:`REBOUND`)
dimse_messages.NamedTemporaryFile                  scp.py       the received file in the spool folder
dimse_messages.create_file_meta                    scp.py       file meta encoded by hand, Source AE slot
dimse_messages.write_file_meta_info                scp.py       writes that encoded file meta
transport.deepcopy                                 scp.py       presentation contexts not deep-copied
_config.STORE_RECV_CHUNKED_DATASET                 scp.py       C-STORE data sets streamed to a file
_config.STORE_SEND_CHUNKED_DATASET                 scp.py       sub-operations read per fragment
_config.LOG_HANDLER_LEVEL                          scp.py       pynetdicom's per-PDU debug handlers off
transport.ThreadedAssociationServer                scp.py       request_queue_size and server_bind set
                                                                while a server starts
acse.negotiate_as_acceptor                         negotiation.py the requestor's order of transfer
                                                                syntaxes
================================================== ============ ==========================================
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.metadata
import importlib.util
import logging
import re
from functools import lru_cache

log = logging.getLogger("dicomweb_server.dimse")

#: the pynetdicom version the hashes below were taken from (pyproject.toml: ``~=3.0.4``)
PINNED_VERSION = "3.0.4"
#: the range a listener runs in without an error at start: >= 3.0.4, < 3.1 (``~=3.0.4``)
TESTED_RANGE = ((3, 0, 4), (3, 1))

#: (module, qualified name) -> (our module that replaces or relies on it, sha256 of the
#: function's source in pynetdicom PINNED_VERSION). Replaced: the first groups; relied on
#: (callers of a rebound module name, functions our code calls or copies): the last.
PINNED: dict[tuple[str, str], tuple[str, str]] = {
    # replaced by reactor.install()
    ("pynetdicom.association", "Association.__init__"):
        ("reactor.py", "454292350429331441b51573f1de8692339a63f41bb4c7b5376f1ace961b4d76"),
    ("pynetdicom.association", "Association._run_reactor"):
        ("reactor.py", "304c896561674fdc8a8c3c87ee41d63ef83f16942a44b64e545dce4a5370c0d1"),
    ("pynetdicom.association", "Association.kill"):
        ("reactor.py", "c3955a9b22eb296952d7ef73129466574e5c6116c75da30b5504002c17394814"),
    ("pynetdicom.dul", "DULServiceProvider.run_reactor"):
        ("reactor.py", "61c299b9a930fb8740258c5518eed55255153ee890a826bed3d3483b42e1b110"),
    ("pynetdicom.dul", "DULServiceProvider.kill_dul"):
        ("reactor.py", "d64f51d35ae851e0fa8fcd356521b0d3022914b9be5f243936bcafb9c2a8ff16"),
    ("pynetdicom.dul", "DULServiceProvider.send_pdu"):
        ("reactor.py", "cdacfa87114b2096eee1b972092d34c7019af341aa0a69f91f15c0e79bfd13e0"),
    ("pynetdicom.transport", "AssociationSocket._create_socket"):
        ("reactor.py", "6cb9411e44b0952d1473a608a790eb050fec3ceff729238eec13a5e11530afdc"),
    # replaced by scp.install() and DimseServer._listen
    ("pynetdicom.association", "Association.send_c_store"):
        ("scp.py", "5761547a43760f514150cc9e713a19b21e76a0264c7500252d406a5125129fab"),
    ("pynetdicom.transport", "AssociationSocket.recv"):
        ("scp.py", "3da52b77777b4359851e5f59c97ef2c2537e11f89c6efb1eb808562e2dde8cb5"),
    ("pynetdicom.transport", "AssociationServer.server_bind"):
        ("scp.py", "693a0d3ac805f034f8e860ebe557adce856dfa68b4e3efe2eeaa8fed478dbcb3"),
    ("pynetdicom.transport", "AssociationServer.get_request"):
        ("scp.py", "d8a5ca12382bb621ce2a3ddf878c19bed9c611e53c51fd1005ee844ba12025b5"),
    ("pynetdicom.dimse_messages", "DIMSEMessage.encode_msg"):
        ("scp.py", "e5951f59c62b07dc3739b21be9dc592ac3756a245309aaf0202e04eb43f6b0d5"),
    # replaced by pdata.install() and store_rsp.install()
    ("pynetdicom.dul", "DULServiceProvider._read_pdu_data"):
        ("pdata.py", "c5f07708cfb78a70d039d5f8eac54258e16b76a3a5ed016a9affaf4ed5aa9134"),
    ("pynetdicom.dimse", "DIMSEServiceProvider.receive_primitive"):
        ("pdata.py", "533d17b6a815edee0cf264b62db31dd54ce9b3ec4c77c466a418bce0258ab584"),
    ("pynetdicom.dimse", "DIMSEServiceProvider.send_msg"):
        ("store_rsp.py", "bc8c411d046c95f8a31fc28ad24c1338630ea7acde3a7505eb54858f487f35b9"),
    # replaced by access.install(): the DIMSE access check before every service
    ("pynetdicom.association", "Association._serve_request"):
        ("access.py", "b2b830a81a99d40aa450fb580e1b69c3b7d7111c603502f2c215561564bdd6ab"),
    # relied on: they call the names scp.install() rebinds in their modules
    # (NamedTemporaryFile, create_file_meta, write_file_meta_info; deepcopy)
    ("pynetdicom.dimse_messages", "DIMSEMessage.decode_msg"):
        ("scp.py", "4a6a0156bb315c5cadc7db2b977b77385716c0e9d281d6a10ab4d0418897a8b6"),
    ("pynetdicom.transport", "RequestHandler._create_association"):
        ("scp.py", "6e1e1aa28e55307c95291117996e46f5ea1ac9b269dcc08a01543af853a0993f"),
    ("pynetdicom.dsutils", "create_file_meta"):
        ("scp.py", "a7bea44d24aa18d967bcf40faf92be5c409b2c955923b36b37f22a965dc8992e"),
    # relied on: slots.py reads a process's connections from these threads and rejects with this
    ("pynetdicom.transport", "AssociationServer.active_associations"):
        ("slots.py", "626ae0e801667a3f119715b8b66edc025e0104ee9666cab7b11636137eda404f"),
    ("pynetdicom.transport", "ThreadedAssociationServer.process_request_thread"):
        ("slots.py", "298e69cdb8be90e832a793a3216f918ec0bcbe9b1cea748054af35ad9c5aff80"),
    ("pynetdicom.acse", "ACSE.send_reject"):
        ("slots.py", "b869ca9cc83190627e85cfd8c91fe3c3bef08999f45bca585b12d29433b838a9"),
    # relied on: called by reactor.py's DUL loop as pynetdicom's own loop calls them
    ("pynetdicom.dul", "DULServiceProvider._is_transport_event"):
        ("reactor.py", "a192323b769ecd4ab1349db0b819516a7dce2d42fc65d8bdec919984e5ebbab0"),
    ("pynetdicom.dul", "DULServiceProvider._process_recv_primitive"):
        ("reactor.py", "e60d44a78a9f3a2d44fa62763460966bcff2af74bfa56d8834ec051b33dfb385"),
    # relied on: cstore_rx.py does on the DUL thread what these do for a C-STORE
    ("pynetdicom.service_class", "StorageServiceClass.SCP"):
        ("cstore_rx.py", "726a71d3d6ae3e672bde2c9671d6579347f80f47255a6c58e72c6908dc3b0761"),
    ("pynetdicom.service_class", "ServiceClass.validate_status"):
        ("cstore_rx.py", "047839721abb1d63b7d2e1866c88e42e3487f5aee0ef5927ed54fb7736ffeb53"),
    ("pynetdicom.dimse_messages", "DIMSEMessage.message_to_primitive"):
        ("cstore_rx.py", "95c5a14dc7d2b04b2d3848e76745f1a27821f5905ee8e797a5935231df4d557d"),
    ("pynetdicom.transport", "AssociationSocket.send"):
        ("cstore_rx.py", "30954262b82648fb3991f9ed998dd7b2fa2cb1a744ad5cbf6c81a16b9da420ae"),
    ("pynetdicom.fsm", "DT_1"):
        ("cstore_rx.py", "ed12799eee42eb246b842f6c6cf7901bc596855afb0654597206ad4384ce6404"),
    ("pynetdicom.sop_class", "uid_to_service_class"):
        ("cstore_rx.py", "169c65884d822fa045759403a1411ea574adc187e3f3bfd3098aeb783278b688"),
    # relied on: negotiation.py amends the first's answer; the second calls the name it rebinds
    ("pynetdicom.presentation", "negotiate_as_acceptor"):
        ("negotiation.py", "9e34a18626d6488d8e3605c6b111da204fc85bf9708c446579b3118b6e9bd135"),
    ("pynetdicom.acse", "ACSE._negotiate_as_acceptor"):
        ("negotiation.py", "390acb76f521e611d23e44af30581299c9510fb4ea5444d19b5acf0b15eb4d60"),
    # relied on: a refused C-MOVE's destination association, never opened, is retrieve_scp._NotAssociated
    ("pynetdicom.service_class", "QueryRetrieveServiceClass._move_scp"):
        ("retrieve_scp.py", "f57965190acb491d4d888734151f68e27705f32f987db9cacc890c36a93bbe2c"),
}

#: methods our patches add where pynetdicom defines none (slots.install: Association.run, a
#: threading.Thread's; scp.install: AssociationServer.verify_request, socketserver's): a
#: pynetdicom release that defines one would be overridden silently. Value: our module.
ABSENT: dict[tuple[str, str], str] = {
    ("pynetdicom.association", "Association.run"): "slots.py",
    ("pynetdicom.transport", "AssociationServer.verify_request"): "slots.py",
}

#: module attributes rebound or set by scp.install() (and negotiation.install()): they must still exist there. Value: our module.
REBOUND: dict[tuple[str, str], str] = {
    ("pynetdicom.dimse_messages", "NamedTemporaryFile"): "scp.py",
    ("pynetdicom.dimse_messages", "create_file_meta"): "scp.py",
    ("pynetdicom.dimse_messages", "write_file_meta_info"): "scp.py",
    ("pynetdicom.transport", "deepcopy"): "scp.py",
    ("pynetdicom._config", "STORE_RECV_CHUNKED_DATASET"): "scp.py",
    ("pynetdicom._config", "STORE_SEND_CHUNKED_DATASET"): "scp.py",
    ("pynetdicom._config", "LOG_HANDLER_LEVEL"): "scp.py",
    ("pynetdicom.transport", "ThreadedAssociationServer"): "scp.py",
    ("pynetdicom.acse", "negotiate_as_acceptor"): "negotiation.py",
}


@lru_cache(maxsize=None)
def _tree(module: str) -> tuple[str, ast.Module]:
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise LookupError(f"no module {module}")
    with open(spec.origin, encoding="utf-8") as f:
        text = f.read()
    return text, ast.parse(text)


def function_source(module: str, qualname: str) -> str:
    """The source text of ``qualname`` (``Class.method`` or ``function``) as written in
    ``module``'s file. Raises LookupError when it is not defined there."""
    text, node = _tree(module)
    body: list[ast.stmt] = node.body
    parts = qualname.split(".")
    for i, name in enumerate(parts):
        kinds = (ast.FunctionDef, ast.AsyncFunctionDef) if i == len(parts) - 1 else (ast.ClassDef,)
        found = [n for n in body if isinstance(n, kinds) and n.name == name]
        if not found:
            raise LookupError(f"{module}.{qualname} is not defined in {module}")
        if i == len(parts) - 1:
            return ast.get_source_segment(text, found[-1]) or ""
        body = found[-1].body
    raise LookupError(qualname)


def source_hash(module: str, qualname: str) -> str:
    return hashlib.sha256(function_source(module, qualname).encode()).hexdigest()


def changed() -> list[str]:
    """One line per pinned function whose source differs from :data:`PINNED` (or is
    gone), per method we add that pynetdicom now defines, and per rebound attribute that
    no longer exists, each naming our module to review; [] when all match."""
    out = []
    for (module, qualname), (ours, digest) in PINNED.items():
        name = f"{module.removeprefix('pynetdicom.')}.{qualname}"
        try:
            now = source_hash(module, qualname)
        except LookupError:
            out.append(f"pynetdicom's {name} is gone: review dimse/{ours}'s patch or use of it")
            continue
        if now != digest:
            out.append(f"pynetdicom's {name} changed (sha256 {now[:12]}, pinned {digest[:12]}): "
                       f"review dimse/{ours}'s patch or use of it")
    for (module, qualname), ours in ABSENT.items():
        try:
            function_source(module, qualname)
        except LookupError:
            continue
        out.append(f"pynetdicom's {module.removeprefix('pynetdicom.')}.{qualname} is now defined by "
                   f"pynetdicom: dimse/{ours}'s replacement would hide it")
    for (module, name), ours in REBOUND.items():
        if not hasattr(importlib.import_module(module), name):
            out.append(f"pynetdicom's {module.removeprefix('pynetdicom.')}.{name} is gone: "
                       f"review dimse/{ours}'s rebinding of it")
    return out


def installed_version() -> str:
    return importlib.metadata.version("pynetdicom")


def _release(version: str) -> tuple[int, ...]:
    """(3, 0, 4) of "3.0.4" (or "3.0.4rc1", "3.1.0.dev0": the numbers before anything else)."""
    m = re.match(r"\d+(\.\d+)*", version)
    return tuple(int(x) for x in m.group(0).split(".")) if m else ()


def check_installed() -> str | None:
    """At a listener's start: an error (logged, and returned) when the installed pynetdicom is
    outside :data:`TESTED_RANGE`, naming the internals that changed; None when inside. The
    listener serves on: the patches may still hold, and DIMSE off would be worse."""
    version = installed_version()
    low, high = TESTED_RANGE
    if low <= _release(version) < high:
        return None
    try:
        what = changed()
    except Exception as e:  # noqa: BLE001  (a layout we cannot read: say so, serve on)
        what = [f"the pinned functions could not be read ({e})"]
    message = (f"pynetdicom {version} is installed, but the DIMSE listener replaces pynetdicom internals and was "
               f"tested with >= {'.'.join(map(str, low))}, < {'.'.join(map(str, high))} (pyproject.toml: "
               f"pynetdicom~={PINNED_VERSION}): install that, or review dimse/pins.py. "
               + ("; ".join(what) if what else "The pinned internals are unchanged."))
    log.error("%s", message)
    return message
