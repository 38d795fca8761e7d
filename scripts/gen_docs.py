"""Generate the parts of the documentation that the code defines, so they cannot drift.

    python scripts/gen_docs.py           # rewrite the generated blocks in docs/
    python scripts/gen_docs.py --check   # exit 1, naming the stale pages, when a block differs

Each generated block sits between ``<!-- BEGIN GENERATED name -->`` and ``<!-- END
GENERATED name -->`` in a page whose other text is written by hand:

- docs/configuration.md ``settings``: every field of :class:`dicomweb_server.settings.Settings`
  (name, the ``dicomweb-server serve`` flag that sets it, read from the command line's own
  parser, the ``DICOMWEB_*`` environment variable, the default, the allowed range from the
  field's ``ge``/``gt``/``le`` constraints as ``settings.field_bound`` reads them for the error
  messages, the field's description);
- docs/routing.md ``delivery``: the ``[delivery]`` keys of the routes file, their ranges
  (``routing.rules.DELIVERY_BOUNDS``) and defaults (``routing.rules.Delivery``);
- docs/conformance.md ``implementation``, ``dimse-contexts``, ``storage-sop-classes``: the
  presentation contexts the DIMSE listener accepts, from the listener's own association policy
  (``DimseServer._make_ae``: the SOP classes, ``TRANSFER_SYNTAXES``, roles);
- docs/conformance.md ``pixel-media-types``: PS3.18 Table 8.7.3-5 as the archive serves it
  (``dicom/media_types.PIXEL_MEDIA_TYPES``, the table that drives negotiation and part labels).

The pages are committed (they read as plain Markdown in the repository and in a source
tarball, without building the site); ``tests/docs/test_docs.py`` runs ``--check``, so a
changed setting or context table fails the tests until the pages are regenerated.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

BEGIN = "<!-- BEGIN GENERATED {name} (scripts/gen_docs.py; do not edit by hand) -->"
END = "<!-- END GENERATED {name} -->"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _flags() -> dict[str, str]:
    """Settings field -> the serve flag(s) that set it, from the command line's parser."""
    from dicomweb_server.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))  # noqa: SLF001
    serve = sub.choices["serve"]
    flags: dict[str, str] = {}
    for action in serve._actions:  # noqa: SLF001
        if not action.option_strings or action.dest == "help":
            continue
        text = ", ".join(f"`{o}`" for o in action.option_strings)
        if isinstance(action, argparse._AppendAction):  # noqa: SLF001
            text += " (repeat)"
        flags[action.dest] = text
    return flags


def _default(field) -> str:
    value = field.default_factory() if field.default_factory is not None else field.default
    if value is None:  # the description says what applies when unset, where anything does
        return "see meaning" if "default:" in (field.description or "") else "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, (list, dict)) and not value:
        return "none"
    if isinstance(value, Path):
        text = str(value)
        return f"`{text if value.is_absolute() or text.startswith('.') else './' + text}`"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int):
        for unit, size in (("GiB", 1024**3), ("MiB", 1024**2)):
            if value >= size and value % size == 0:
                return f"{value // size} {unit} ({value})"
        return str(value)
    if value == "":
        return "empty"
    return f"`{value}`"


def settings_table() -> str:
    from dicomweb_server.settings import Settings, field_bound

    flags = _flags()
    rows = ["| setting | flag | environment | default | allowed | meaning |", "|---|---|---|---|---|---|"]
    for name, field in Settings.model_fields.items():
        description = field.description or ""
        if description.startswith("internal:"):
            continue
        env = f"`DICOMWEB_{name.upper()}`"
        origin = getattr(field.annotation, "__origin__", field.annotation)
        if origin in (list, dict):
            env += " (JSON)"
        bound = field_bound(name)
        allowed = bound.describe() if bound is not None else ""
        rows.append(f'| <a id="{name}"></a>`{name}` | {flags.get(name, "")} | {env} | {_default(field)} '
                    f"| {allowed} | {_cell(description)} |")
    return "\n".join(rows)


def delivery_table() -> str:
    """The ``[delivery]`` keys of the routes file: range and default, as ``routing/rules.py``
    checks and applies them."""
    from dataclasses import fields

    from dicomweb_server.routing.rules import DELIVERY_BOUNDS, Delivery

    defaults = {f.name: f.default for f in fields(Delivery)}
    rows = ["| key | allowed | default |", "|---|---|---|"]
    for key, bound in DELIVERY_BOUNDS.items():
        value = defaults[key]
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        rows.append(f"| `{key}` | {bound.describe()} | {value} |")
    return "\n".join(rows)


def _listener_ae():
    """The AE of the DIMSE listener with the default settings, built by the listener's own code."""
    from dicomweb_server.dimse.scp import DimseServer
    from dicomweb_server.settings import Settings

    return DimseServer._make_ae(SimpleNamespace(settings=Settings()))  # noqa: SLF001


def _uid_name(uid: str) -> str:
    from pydicom.uid import UID

    return UID(uid).name


def _role(cx) -> str:
    """What this archive is on a context it accepts: SCP; SCU too where it accepts SCP/SCU role
    selection (a C-GET requestor is the Storage SCP of its own association, PS3.7 D.3.3.4)."""
    return "SCP, and SCU for C-GET" if cx.scu_role else "SCP"


def _storage_contexts(ae):
    from dicomweb_server.dimse.scp import TRANSFER_SYNTAXES

    return [cx for cx in ae.supported_contexts if list(cx.transfer_syntax) == [str(t) for t in TRANSFER_SYNTAXES]]


def implementation() -> str:
    from pynetdicom._globals import APPLICATION_CONTEXT_NAME  # what pynetdicom's ACSE sends and accepts

    from dicomweb_server import __version__
    from dicomweb_server.dimse.slots import per_peer_limit
    from dicomweb_server.settings import Settings

    ae = _listener_ae()
    settings = Settings()
    return "\n".join([
        "| | |", "|---|---|",
        f"| Product | dicomweb-archive {__version__} (`dicomweb_server`) |",
        f"| Application Context Name | `{APPLICATION_CONTEXT_NAME}` |",
        f"| Implementation Class UID | `{ae.implementation_class_uid}` |",
        f"| Implementation Version Name | `{ae.implementation_version_name}` |",
        f"| AE title (default) | `{ae.ae_title}` (setting `ae_title`) |",
        f"| Maximum PDU length received (default) | {ae.maximum_pdu_size} bytes (setting `dimse_max_pdu`) |",
        f"| Associations accepted at a time (default) | {settings.dimse_max_associations} on the node, all "
        "listener processes together (setting `dimse_max_associations`); "
        f"{per_peer_limit(settings)} per peer address and per calling AE title "
        "(setting `dimse_max_associations_per_peer`) |",
        f"| Timeouts (default): ACSE, DIMSE, network | {ae.acse_timeout:g} s, {ae.dimse_timeout:g} s, "
        f"{ae.network_timeout:g} s |",
        f"| DIMSE port (default) | {settings.dimse_port} (setting `dimse_port`) |",
        f"| DICOM TLS port (default) | {settings.dimse_tls_port or 'off'} (setting `dimse_tls_port`; "
        "PS3.15 B.9 Non-downgrading BCP 195 TLS profile) |",
    ])


def dimse_contexts() -> str:
    from dicomweb_server.dimse.scp import TRANSFER_SYNTAXES

    ae = _listener_ae()
    storage = {cx.abstract_syntax for cx in _storage_contexts(ae)}
    rows = [("Verification, Storage Commitment, Query/Retrieve, Modality Worklist and Modality Performed "
             "Procedure Step "
             "(accepted, one presentation context each):"), "",
            "| SOP class | UID | transfer syntaxes | role |", "|---|---|---|---|"]
    for cx in ae.supported_contexts:
        if cx.abstract_syntax in storage:
            continue
        ts = "<br>".join(f"{_uid_name(t)} `{t}`" for t in cx.transfer_syntax)
        rows.append(f"| {_uid_name(cx.abstract_syntax)} | `{cx.abstract_syntax}` | {ts} | {_role(cx)} |")
    sample = next(cx for cx in ae.supported_contexts if cx.abstract_syntax in storage)
    rows += ["", f"Storage ({len(storage)} SOP classes, listed below), each with these transfer syntaxes; "
             f"role: {_role(sample)}; the data set is stored as received, in the syntax it was sent in:", "",
             "| transfer syntax | UID |", "|---|---|"]
    rows += [f"| {_uid_name(str(t))} | `{t}` |" for t in TRANSFER_SYNTAXES]
    return "\n".join(rows)


def storage_sop_classes() -> str:
    ae = _listener_ae()
    rows = ["| Storage SOP class | UID |", "|---|---|"]
    rows += [f"| {_uid_name(cx.abstract_syntax)} | `{cx.abstract_syntax}` |" for cx in _storage_contexts(ae)]
    return "\n".join(rows)


def pixel_media_types() -> str:
    from dicomweb_server.dicom.media_types import PIXEL_MEDIA_TYPES

    rows = ["| media type | transfer syntaxes (the first is the default) | also accepted in Accept | "
            "frames |", "|---|---|---|---|"]
    for m in PIXEL_MEDIA_TYPES:
        ts = "<br>".join(f"{_uid_name(t)} `{t}`" for t in m.transfer_syntaxes)
        aliases = ", ".join(f"`{a}`" for a in m.aliases)
        frames = "one stream: bulk data only (frames 406)" if m.video else "one part per frame"
        rows.append(f"| `{m.media_type}` | {ts} | {aliases} | {frames} |")
    return "\n".join(rows)


PAGES = {
    "docs/configuration.md": {"settings": settings_table},
    "docs/routing.md": {"delivery": delivery_table},
    "docs/conformance.md": {
        "implementation": implementation,
        "dimse-contexts": dimse_contexts,
        "storage-sop-classes": storage_sop_classes,
        "pixel-media-types": pixel_media_types,
    },
}


def render(text: str, blocks: dict) -> str:
    for name, make in blocks.items():
        begin, end = BEGIN.format(name=name), END.format(name=name)
        pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.DOTALL)
        if not pattern.search(text):
            raise SystemExit(f"gen_docs: no block {name!r} ({begin} ... {end})")
        text = pattern.sub(lambda _m: f"{begin}\n{make()}\n{end}", text, count=1)
    return text


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 when a page is stale")
    args = p.parse_args(argv)
    stale = []
    for page, blocks in PAGES.items():
        path = ROOT / page
        text = path.read_text()
        new = render(text, blocks)
        if new != text:
            stale.append(page)
            if not args.check:
                path.write_text(new)
    if args.check and stale:
        print(f"gen_docs: stale: {', '.join(stale)}; run: python scripts/gen_docs.py", file=sys.stderr)
        return 1
    if not args.check:
        print(f"gen_docs: {'rewrote ' + ', '.join(stale) if stale else 'all pages current'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
