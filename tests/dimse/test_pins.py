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


def test_a_changed_function_is_named_with_the_module_to_review(monkeypatch):
    monkeypatch.setitem(pins.PINNED, ("pynetdicom.dimse", "DIMSEServiceProvider.send_msg"), ("store_rsp.py", "0" * 64))
    monkeypatch.setitem(pins.PINNED, ("pynetdicom.dul", "DULServiceProvider.no_such_method"), ("reactor.py", "0" * 64))
    digest = pins.source_hash("pynetdicom.dimse", "DIMSEServiceProvider.send_msg")
    assert pins.changed() == [
        f"pynetdicom's dimse.DIMSEServiceProvider.send_msg changed (sha256 {digest[:12]}, pinned 000000000000): "
        "review dimse/store_rsp.py's patch or use of it",
        "pynetdicom's dul.DULServiceProvider.no_such_method is gone: review dimse/reactor.py's patch or use of it",
    ]


def test_an_added_method_that_we_override_is_named(monkeypatch):
    monkeypatch.setattr(pins, "ABSENT", {("pynetdicom.transport", "AssociationSocket.recv"): "scp.py"})
    assert pins.changed() == ["pynetdicom's transport.AssociationSocket.recv is now defined by pynetdicom: "
                              "dimse/scp.py's replacement would hide it"]


def test_the_docstring_table_names_every_pinned_internal_with_its_module():
    """The table of dimse/pins.py (internal, our module, why) lists every entry, so that the
    reasons are written down where the hashes are."""
    lines = pins.__doc__.splitlines()
    borders = [i for i, line in enumerate(lines) if line.startswith("=====")]
    body = lines[borders[1] + 1:borders[2]]  # the rows between the header's border and the last
    rows = {}
    for i, line in enumerate(body):
        if line[:1] not in (" ", "*", ""):  # a row's first line: internal, our module (or next line), why
            words = line.split()
            rows[words[0]] = words[1] if len(words) > 1 else body[i + 1].split()[0]
    expected = {f"{m.removeprefix('pynetdicom.')}.{q}": ours for (m, q), (ours, _) in pins.PINNED.items()}
    expected |= {f"{m.removeprefix('pynetdicom.')}.{q}": ours for (m, q), ours in pins.ABSENT.items()}
    expected |= {f"{m.removeprefix('pynetdicom.')}.{q}": ours for (m, q), ours in pins.REBOUND.items()}
    assert {k: rows.get(k) for k in expected} == expected
    assert set(rows) - set(expected) == set()


def test_a_listener_with_an_untested_pynetdicom_logs_an_error_and_serves(tmp_path, monkeypatch, caplog):
    """pynetdicom 3.1.0 installed (as the metadata says; the code is 3.0.4's): the listener logs
    one error naming the version, the tested range and the changed functions (none here), and
    answers a C-ECHO. 3.0.4 and 3.0.9 (inside the range): no error."""
    from pynetdicom import AE
    from pynetdicom.sop_class import Verification

    from dicomweb_server.archive import Archive
    from dicomweb_server.settings import Settings

    assert pins.check_installed() is None
    monkeypatch.setattr(pins, "installed_version", lambda: "3.0.9")
    assert pins.check_installed() is None
    monkeypatch.setattr(pins, "installed_version", lambda: "3.1.0")
    archive = Archive.open(Settings(data_dir=tmp_path / "data", index="memory"))
    server = scp.DimseServer(archive)
    with caplog.at_level("ERROR", logger="dicomweb_server.dimse"):
        port = server.start(host="127.0.0.1", port=0)
    try:
        errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
        assert errors == ["pynetdicom 3.1.0 is installed, but the DIMSE listener replaces pynetdicom internals and "
                          "was tested with >= 3.0.4, < 3.1 (pyproject.toml: pynetdicom~=3.0.4): install that, or "
                          "review dimse/pins.py. The pinned internals are unchanged."]
        ae = AE(ae_title="TESTSCU")
        ae.add_requested_context(Verification)
        assoc = ae.associate("127.0.0.1", port, ae_title="DICOMWEB")
        assert assoc.is_established
        assert assoc.send_c_echo().Status == 0
        assoc.release()
    finally:
        server.stop()
        archive.close()


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
