"""Real clients against the archive: the OHIF viewer in headless Chromium and the PyPI
``dicomweb-client`` in a virtual environment of its own.

These tests fetch what they need themselves (the OHIF package with ``npm pack``, the
PyPI client with ``pip`` into a cached venv). What they cannot install -- Debian's
``chromium``, ``npm``, the ``playwright`` Python package -- makes them **fail** with
the command to run, never skip silently; set ``DICOMWEB_INTEROP=skip`` to skip them
on a machine that lacks those on purpose.

Environment:
  DICOMWEB_INTEROP=skip               skip (instead of fail) when a prerequisite is missing
  DICOMWEB_CHROMIUM=/path             the browser (default: chromium on PATH)
  DICOMWEB_VIEWER_DIR=/path           an OHIF dist/ folder (default: installed with npm into ~/.cache)
  DICOMWEB_PYPI_CLIENT_PYTHON=/path   a Python with the PyPI dicomweb-client (default: a venv in ~/.cache)
  DICOMWEB_INTEROP_ARTIFACTS=/path    screenshots and request logs (default: $TMPDIR/dicomweb-interop)
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import httpx
import pytest

from .studies import stow_body


def require(ok: bool, what: str, how: str) -> None:
    """Fail (or skip, with DICOMWEB_INTEROP=skip) when a prerequisite is missing."""
    if ok:
        return
    message = f"{what} is missing: {how}"
    if os.environ.get("DICOMWEB_INTEROP", "").lower() == "skip":
        pytest.skip(message)
    pytest.fail(message + "  (or set DICOMWEB_INTEROP=skip to skip the interop tests)", pytrace=False)


@pytest.fixture(scope="session")
def artifacts() -> Path:
    path = Path(os.environ.get("DICOMWEB_INTEROP_ARTIFACTS") or Path(tempfile.gettempdir()) / "dicomweb-interop")
    path.mkdir(parents=True, exist_ok=True)
    return path


def store(url: str, datasets) -> None:
    body, ctype = stow_body(datasets)
    r = httpx.post(f"{url}/studies", content=body, headers={"Content-Type": ctype}, timeout=60)
    assert r.status_code == 200, r.text
