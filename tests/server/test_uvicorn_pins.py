"""The uvicorn internals the HTTP front door relies on, pinned (as dimse/pins.py pins
pynetdicom's): api/limits.py subclasses uvicorn's httptools protocol and overrides its
connection and parser callbacks; api/balance.py mirrors ``uvicorn.main.run`` for several
workers, rebinds ``multiprocess.Process`` while its supervisor runs, and extends
``Server.startup``/``shutdown``/``on_tick``. pyproject.toml pins the uvicorn version they were
written against; a hash of each function's source (read from the file, as it is in that
version) fails this test naming the function and our module to review when another uvicorn
(or a local edit) changes one, instead of changing behaviour silently."""

from __future__ import annotations

import ast
import hashlib
import importlib
from importlib.metadata import version

import pytest

PINNED_VERSION = "0.55.0"
#: (module, qualified name): (sha256 of its source, first 16 hex digits; our module to review)
PINNED = {
    ("uvicorn.supervisors.multiprocess", "Process.__init__"): ("6f0a0fb39cf709b8", "api/balance.py"),
    ("uvicorn.supervisors.multiprocess", "Process.server"): ("26f665f22a3a6ddc", "api/balance.py"),
    ("uvicorn.supervisors.multiprocess", "Process.target"): ("482d356f8a43cf6e", "api/balance.py"),
    ("uvicorn.supervisors.multiprocess", "Multiprocess.__init__"): ("4a76b42a9bdee23e", "api/balance.py"),
    ("uvicorn.supervisors.multiprocess", "Multiprocess.init_processes"): ("4d6cbf2d21fe4756", "api/balance.py"),
    ("uvicorn.supervisors.multiprocess", "Multiprocess.restart_all"): ("e9e33492b7322aa7", "api/balance.py"),
    ("uvicorn.supervisors.multiprocess", "Multiprocess.keep_subprocess_alive"): ("857675db4ca2457a",
                                                                                 "api/balance.py"),
    ("uvicorn.supervisors.multiprocess", "Multiprocess.run"): ("c8859ecf2d339129", "api/balance.py"),
    ("uvicorn.server", "Server.startup"): ("9a8e644a268033c5", "api/balance.py"),
    ("uvicorn.server", "Server.shutdown"): ("e3c12588a8a4358f", "api/balance.py"),
    ("uvicorn.server", "Server.on_tick"): ("e61b116607303652", "api/balance.py"),
    ("uvicorn.server", "Server.run"): ("b9eb4c53203bc8ea", "api/balance.py"),
    ("uvicorn.server", "Server.serve"): ("ed2360112e98e654", "api/balance.py"),
    ("uvicorn.main", "run"): ("a915f13f77b8c35c", "api/balance.py (run mirrors it) and cli.py"),
    ("uvicorn.protocols.http.httptools_impl", "HttpToolsProtocol.connection_made"): ("90cf013eb407eb3f",
                                                                                     "api/limits.py"),
    ("uvicorn.protocols.http.httptools_impl", "HttpToolsProtocol.connection_lost"): ("c5567cca5922d934",
                                                                                     "api/limits.py"),
    ("uvicorn.protocols.http.httptools_impl", "HttpToolsProtocol.data_received"): ("4344ff8569ed38be",
                                                                                   "api/limits.py"),
    ("uvicorn.protocols.http.httptools_impl", "HttpToolsProtocol.on_message_begin"): ("8b027723aca37972",
                                                                                      "api/limits.py"),
    ("uvicorn.protocols.http.httptools_impl", "HttpToolsProtocol.on_message_complete"): ("ca6a0254d3b3f82d",
                                                                                         "api/limits.py"),
    ("uvicorn.protocols.http.httptools_impl", "HttpToolsProtocol.on_headers_complete"): ("c713423e2fb6aa9d",
                                                                                         "api/limits.py"),
    ("uvicorn.protocols.http.httptools_impl", "HttpToolsProtocol._start_asgi_task"): ("407f0195183e27b9",
                                                                                      "api/limits.py"),
}


def source_hash(module: str, qualname: str) -> str | None:
    """The first 16 hex digits of the sha256 of the function's source in the module's file;
    None when it is not there."""
    mod = importlib.import_module(module)
    with open(mod.__file__, encoding="utf-8") as f:
        src = f.read()
    nodes, node = ast.parse(src).body, None
    for part in qualname.split("."):
        node = next((n for n in nodes if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                     and n.name == part), None)
        if node is None:
            return None
        nodes = node.body
    return hashlib.sha256(ast.get_source_segment(src, node).encode()).hexdigest()[:16]


def changed() -> list[str]:
    return [f"{module}.{qualname} (review dicomweb_server/{ours})" for (module, qualname), (digest, ours)
            in PINNED.items() if source_hash(module, qualname) != digest]


def test_installed_uvicorn_is_the_pinned_version():
    assert version("uvicorn") == PINNED_VERSION


def test_uvicorn_internals_unchanged():
    assert changed() == []


def test_a_changed_function_is_named_with_the_module_to_review(monkeypatch):
    monkeypatch.setitem(PINNED, ("uvicorn.server", "Server.on_tick"), ("0" * 16, "api/balance.py"))
    assert changed() == ["uvicorn.server.Server.on_tick (review dicomweb_server/api/balance.py)"]


@pytest.mark.parametrize("spec", ["uvicorn[standard]==0.55.0"])
def test_pyproject_pins_that_version(spec):
    from pathlib import Path

    assert spec in (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
