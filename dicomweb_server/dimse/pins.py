"""The pynetdicom internals this package replaces or relies on, pinned (issue 33).

:mod:`.scp`, :mod:`.reactor`, :mod:`.pdata`, :mod:`.slots`, :mod:`.access` and :mod:`.store_rsp`
replace methods of pynetdicom's classes process-wide and rebind names its modules
look up at call time (``dimse_messages.create_file_meta``, ``transport.deepcopy``,
...). Each replacement copies or depends on the exact code of the function it
replaces or of the function that calls the rebound name. pyproject.toml pins the
minor version these were written against; :data:`PINNED` holds a hash of each such
function's source as that version has it, so that a new pynetdicom release (or a
local edit of its files) that changes one of them fails ``tests/dimse/test_pins.py``
naming the function, instead of changing behaviour silently.

The source is read from the module's file (:func:`ast.get_source_segment`), not
from the live object: the live attribute is our replacement once a listener ran.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.util
from functools import lru_cache

#: the pynetdicom version the hashes below were taken from (pyproject.toml: ``~=3.0.4``)
PINNED_VERSION = "3.0.4"

#: (module, qualified name) -> sha256 of the function's source in pynetdicom PINNED_VERSION.
#: Replaced: the first group; relied on (callers of a rebound module name): the second.
PINNED: dict[tuple[str, str], str] = {
    # replaced by reactor.install()
    ("pynetdicom.association", "Association.__init__"):
        "454292350429331441b51573f1de8692339a63f41bb4c7b5376f1ace961b4d76",
    ("pynetdicom.association", "Association._run_reactor"):
        "304c896561674fdc8a8c3c87ee41d63ef83f16942a44b64e545dce4a5370c0d1",
    ("pynetdicom.association", "Association.kill"):
        "c3955a9b22eb296952d7ef73129466574e5c6116c75da30b5504002c17394814",
    ("pynetdicom.dul", "DULServiceProvider.run_reactor"):
        "61c299b9a930fb8740258c5518eed55255153ee890a826bed3d3483b42e1b110",
    ("pynetdicom.dul", "DULServiceProvider.kill_dul"):
        "d64f51d35ae851e0fa8fcd356521b0d3022914b9be5f243936bcafb9c2a8ff16",
    ("pynetdicom.dul", "DULServiceProvider.send_pdu"):
        "cdacfa87114b2096eee1b972092d34c7019af341aa0a69f91f15c0e79bfd13e0",
    ("pynetdicom.transport", "AssociationSocket._create_socket"):
        "6cb9411e44b0952d1473a608a790eb050fec3ceff729238eec13a5e11530afdc",
    # replaced by scp.install()
    ("pynetdicom.association", "Association.send_c_store"):
        "5761547a43760f514150cc9e713a19b21e76a0264c7500252d406a5125129fab",
    ("pynetdicom.transport", "AssociationSocket.recv"):
        "3da52b77777b4359851e5f59c97ef2c2537e11f89c6efb1eb808562e2dde8cb5",
    ("pynetdicom.transport", "AssociationServer.server_bind"):
        "693a0d3ac805f034f8e860ebe557adce856dfa68b4e3efe2eeaa8fed478dbcb3",
    ("pynetdicom.dimse_messages", "DIMSEMessage.encode_msg"):
        "e5951f59c62b07dc3739b21be9dc592ac3756a245309aaf0202e04eb43f6b0d5",
    # replaced by pdata.install() and store_rsp.install()
    ("pynetdicom.dul", "DULServiceProvider._read_pdu_data"):
        "c5f07708cfb78a70d039d5f8eac54258e16b76a3a5ed016a9affaf4ed5aa9134",
    ("pynetdicom.dimse", "DIMSEServiceProvider.receive_primitive"):
        "533d17b6a815edee0cf264b62db31dd54ce9b3ec4c77c466a418bce0258ab584",
    ("pynetdicom.dimse", "DIMSEServiceProvider.send_msg"):
        "bc8c411d046c95f8a31fc28ad24c1338630ea7acde3a7505eb54858f487f35b9",
    # replaced by access.install(): the DIMSE access check before every service
    ("pynetdicom.association", "Association._serve_request"):
        "b2b830a81a99d40aa450fb580e1b69c3b7d7111c603502f2c215561564bdd6ab",
    # relied on: they call the names scp.install() rebinds in their modules
    # (NamedTemporaryFile, create_file_meta, write_file_meta_info; deepcopy)
    ("pynetdicom.dimse_messages", "DIMSEMessage.decode_msg"):
        "4a6a0156bb315c5cadc7db2b977b77385716c0e9d281d6a10ab4d0418897a8b6",
    ("pynetdicom.transport", "RequestHandler._create_association"):
        "6e1e1aa28e55307c95291117996e46f5ea1ac9b269dcc08a01543af853a0993f",
    ("pynetdicom.dsutils", "create_file_meta"):
        "a7bea44d24aa18d967bcf40faf92be5c409b2c955923b36b37f22a965dc8992e",
}

#: methods our patches add where pynetdicom defines none (slots.install: Association.run, a
#: threading.Thread's; scp.install: AssociationServer.verify_request, socketserver's): a
#: pynetdicom release that defines one would be overridden silently
ABSENT: tuple[tuple[str, str], ...] = (
    ("pynetdicom.association", "Association.run"),
    ("pynetdicom.transport", "AssociationServer.verify_request"),
)

#: module attributes rebound or set by scp.install(): they must still exist there
REBOUND: tuple[tuple[str, str], ...] = (
    ("pynetdicom.dimse_messages", "NamedTemporaryFile"),
    ("pynetdicom.dimse_messages", "create_file_meta"),
    ("pynetdicom.dimse_messages", "write_file_meta_info"),
    ("pynetdicom.transport", "deepcopy"),
    ("pynetdicom._config", "STORE_RECV_CHUNKED_DATASET"),
    ("pynetdicom._config", "STORE_SEND_CHUNKED_DATASET"),
    ("pynetdicom._config", "LOG_HANDLER_LEVEL"),
    ("pynetdicom.transport", "ThreadedAssociationServer"),
)


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
    gone), and per rebound attribute that no longer exists; [] when all match."""
    out = []
    for (module, qualname), digest in PINNED.items():
        try:
            now = source_hash(module, qualname)
        except LookupError as e:
            out.append(f"{module}.{qualname}: {e}")
            continue
        if now != digest:
            out.append(f"{module}.{qualname}: source changed (sha256 {now[:12]}, pinned {digest[:12]})")
    for module, qualname in ABSENT:
        try:
            function_source(module, qualname)
        except LookupError:
            continue
        out.append(f"{module}.{qualname}: now defined by pynetdicom; our replacement would hide it")
    for module, name in REBOUND:
        if not hasattr(importlib.import_module(module), name):
            out.append(f"{module}.{name}: attribute gone")
    return out
