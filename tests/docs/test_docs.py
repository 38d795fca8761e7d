"""The documentation: the site builds with no broken link or anchor, its generated parts match
the code (settings, DIMSE presentation contexts, pixel media types), the README stays the short
entry point that reaches every page, and nothing refers to files outside the repository."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = ROOT / "README.md"

FIRST_COMMAND = ("python3 -m venv .venv && . .venv/bin/activate && pip install -e . && "
                 "dicomweb-server import --samples && dicomweb-server")


def _env() -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), NO_MKDOCS_2_WARNING="1")
    return env


def test_generated_pages_are_current():
    """docs/configuration.md and the tables of docs/conformance.md are what scripts/gen_docs.py
    makes from the code now (a new setting, flag or presentation context fails this)."""
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_docs.py"), "--check"],
                         capture_output=True, text=True, env=_env(), timeout=120, check=False)
    assert run.returncode == 0, run.stderr


def test_site_builds_strict(tmp_path):
    """`mkdocs build --strict`: every page in the nav, every link and anchor resolves, the
    README's tour and the client README are included, docs/notes/ stays out of the site."""
    try:
        from mkdocs.config import load_config
    except ImportError:
        pytest.fail("mkdocs is not installed: pip install -e '.[docs]'", pytrace=False)
    site = tmp_path / "site"
    run = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                          str(ROOT / "mkdocs.yml"), "--site-dir", str(site)],
                         capture_output=True, text=True, env=_env(), timeout=300, check=False)
    assert run.returncode == 0, run.stderr[-4000:]
    tour = (site / "getting-started" / "index.html").read_text()
    assert "boundary42" in tour and "--8&lt;--" not in tour and "[start:tour]" not in tour
    assert "AsyncDICOMwebClient" in (site / "client" / "index.html").read_text()
    conformance = (site / "conformance" / "index.html").read_text()
    assert "1.2.840.10008.5.1.4.1.1.2" in conformance  # CT Image Storage, from the listener's table
    assert not (site / "notes").exists()
    config = load_config(str(ROOT / "mkdocs.yml"))
    assert config.exclude_docs.match_file("notes/some-branch.md")
    assert "fonts.googleapis.com" not in (site / "index.html").read_text()  # works offline


def test_conformance_lists_what_the_listener_accepts():
    """Independently of the generator: every transfer syntax and storage SOP class the DIMSE
    listener accepts, and every Query/Retrieve model it serves, is named in the statement."""
    from pynetdicom import AllStoragePresentationContexts

    from dicomweb_server.dimse import scp

    text = (DOCS / "conformance.md").read_text()
    uids = [str(ts) for ts in scp.TRANSFER_SYNTAXES]
    uids += [cx.abstract_syntax for cx in AllStoragePresentationContexts]
    uids += [str(m) for m in (*scp._FIND_MODELS, *scp.GET_MODELS, *scp.MOVE_MODELS)]  # noqa: SLF001
    missing = [u for u in uids if f"`{u}`" not in text]
    assert not missing, missing


def test_configuration_names_every_setting():
    from dicomweb_server.settings import Settings

    text = (DOCS / "configuration.md").read_text()
    for name, field in Settings.model_fields.items():
        if (field.description or "").startswith("internal:"):
            continue
        assert f"`DICOMWEB_{name.upper()}`" in text, name


def test_readme_is_the_entry_point():
    """The README: at most 200 lines, the two commands exactly, PostgreSQL named in the test
    paragraph, and a link to every page of the site (what moved out stays reachable)."""
    text = README.read_text()
    assert len(text.splitlines()) <= 200
    assert f"```sh\n{FIRST_COMMAND}\n```" in text
    assert "```sh\n./scripts/test.sh\n```" in text
    tests = text[text.index("Install and run the tests"):text.index("./scripts/test.sh")]
    assert "PostgreSQL" in tests and "postgresql" in tests
    pages = sorted(p.relative_to(ROOT).as_posix() for p in DOCS.glob("*.md"))
    linked = set(re.findall(r"\]\((docs/[^)#]+\.md)", text))
    assert set(pages) <= linked, sorted(set(pages) - linked)


def test_install_script_installs_the_docs_extra():
    assert "'.[test,interop,load,docs]'" in (ROOT / "scripts" / "test.sh").read_text()


OUTSIDE = re.compile(r"\.\./shared|shared/(reference|cases|performance)|performance-facts|lessons\.md|cases\.md")


def test_nothing_refers_to_files_outside_the_repository():
    """The project stands alone: no docstring, help text, test or page names a file of the
    workspace around it (the reference load tests are described in docs/load-testing.md)."""
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    here = Path(__file__).resolve()
    found = []
    for name in files:
        path = ROOT / name
        if path.resolve() == here or path.suffix not in (".py", ".md", ".txt", ".toml", ".yml", ".yaml", ".sh", ".lua"):
            continue
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if OUTSIDE.search(line):
                found.append(f"{name}:{n}: {line.strip()}")
    assert not found, "\n".join(found)
