"""pynetdicom internals that dimse/ replaces or relies on are the ones it was written
against (issue 33; dicomweb_server/dimse/pins.py). A pynetdicom upgrade that changes
one fails here, naming the function."""

from __future__ import annotations

import importlib.metadata
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

from dicomweb_server.dimse import pins, reactor, scp  # noqa: F401  (their patches are what is pinned)


def test_pynetdicom_internals_unchanged():
    assert pins.changed() == []


def test_installed_pynetdicom_is_the_pinned_version():
    assert importlib.metadata.version("pynetdicom") == pins.PINNED_VERSION
    project = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    req = next(Requirement(r) for r in project["project"]["dependencies"] if r.startswith("pynetdicom"))
    assert pins.PINNED_VERSION in req.specifier
    assert "3.1.0" not in req.specifier  # a minor release is a deliberate upgrade, with new pins


def test_a_changed_function_is_named(monkeypatch):
    monkeypatch.setitem(pins.PINNED, ("pynetdicom.dimse", "DIMSEServiceProvider.send_msg"), "0" * 64)
    monkeypatch.setitem(pins.PINNED, ("pynetdicom.dul", "DULServiceProvider.no_such_method"), "0" * 64)
    out = pins.changed()
    assert len(out) == 2
    assert out[0].startswith("pynetdicom.dimse.DIMSEServiceProvider.send_msg: source changed")
    assert out[1].startswith("pynetdicom.dul.DULServiceProvider.no_such_method: ")


def test_an_added_method_that_we_override_is_named(monkeypatch):
    monkeypatch.setattr(pins, "ABSENT", (("pynetdicom.transport", "AssociationSocket.recv"),))
    assert pins.changed() == ["pynetdicom.transport.AssociationSocket.recv: now defined by pynetdicom; "
                              "our replacement would hide it"]


def test_every_replaced_method_is_pinned():
    """Each (class, method) that the install() functions assign is in PINNED or ABSENT:
    read from the patching modules' source, so a new monkeypatch without a pin fails."""
    import ast
    import importlib
    import inspect

    import pkgutil

    import dicomweb_server.dimse as package

    aliases = {"Association": "Association", "DUL": "DULServiceProvider", "Socket": "AssociationSocket"}
    pinned = {q for _m, q in pins.PINNED} | {q for _m, q in pins.ABSENT}
    missing = []
    modules = [importlib.import_module(f"dicomweb_server.dimse.{m.name}") for m in pkgutil.iter_modules(package.__path__)
               if m.name != "__main__"]  # every module of the DIMSE front door: a new one's patches count too
    for module in modules:
        for node in ast.walk(ast.parse(inspect.getsource(module))):
            targets = node.targets if isinstance(node, ast.Assign) else []
            for t in targets:
                elts = t.elts if isinstance(t, ast.Tuple) else [t]
                for e in elts:
                    if not (isinstance(e, ast.Attribute) and isinstance(e.value, (ast.Attribute, ast.Name))):
                        continue
                    owner = e.value.attr if isinstance(e.value, ast.Attribute) else e.value.id
                    owner = aliases.get(owner, owner)
                    if owner[:1].isupper() and owner not in ("ThreadedAssociationServer",) \
                            and not owner.startswith("_"):
                        if f"{owner}.{e.attr}" not in pinned:
                            missing.append(f"{module.__name__}: {owner}.{e.attr}")
    assert missing == []
