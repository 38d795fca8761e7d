"""Media type values of Content-Type and Accept header fields (RFC 9110 Section 8.3.1, 5.6.6).

DICOMweb negotiates with parameters (``type``, ``transfer-syntax``, ``boundary``, ``q``;
PS3.18 Section 8.7): this module parses and formats them; :mod:`.media` builds Accept
values from ``media_types`` arguments and :mod:`.multipart` reads the boundary.
"""
from __future__ import annotations

from typing import Mapping

__all__ = ["format_media_type", "parse_media_type"]

_TOKEN_SEPARATORS = set('()<>@,;:\\"/[]?={} \t')


def parse_media_type(value: str | None) -> tuple[str, dict[str, str]]:
    """Split a Content-Type value into media type and parameters.

    Names are case-insensitive (returned lower-case), values may be quoted
    or not (quotes and backslash escapes removed), whitespace around ``;``
    and ``=`` is ignored, and quoted values may contain ``;``, ``=`` or ``,``.

    Parameters
    ----------
    value : str or None
        e.g. ``'Multipart/Related; TYPE="application/dicom"; boundary=a=b.c'``

    Returns
    -------
    tuple of (str, dict of str to str)
        ``("multipart/related", {"type": "application/dicom", "boundary": "a=b.c"})``.
        An empty or missing value gives ``("", {})``.

    Examples
    --------
    >>> parse_media_type('multipart/related; type="application/dicom"; boundary="x;y"')
    ('multipart/related', {'type': 'application/dicom', 'boundary': 'x;y'})
    """
    if not value:
        return "", {}
    s = value
    n = len(s)
    i = s.find(";")
    media_type = (s if i < 0 else s[:i]).strip().lower()
    params: dict[str, str] = {}
    if i < 0:
        return media_type, params
    i += 1
    while i < n:
        # skip whitespace and empty parameters
        while i < n and s[i] in " \t;":
            i += 1
        if i >= n:
            break
        start = i
        while i < n and s[i] not in "=;":
            i += 1
        name = s[start:i].strip().lower()
        if i >= n or s[i] == ";":
            # a parameter without value: keep it with an empty value
            if name:
                params.setdefault(name, "")
            continue
        i += 1  # '='
        while i < n and s[i] in " \t":
            i += 1
        if i < n and s[i] == '"':
            i += 1
            buf = []
            while i < n and s[i] != '"':
                if s[i] == "\\" and i + 1 < n:
                    i += 1
                buf.append(s[i])
                i += 1
            i += 1  # closing quote (or end)
            val = "".join(buf)
            # skip anything up to the next ';'
            while i < n and s[i] != ";":
                i += 1
        else:
            start = i
            while i < n and s[i] != ";":
                i += 1
            val = s[start:i].strip()
            # tolerate a value quoted with single quotes
            if len(val) >= 2 and val[0] == val[-1] == "'":
                val = val[1:-1]
        if name:
            params.setdefault(name, val)
    return media_type, params


def _needs_quotes(value: str) -> bool:
    return value == "" or any(c in _TOKEN_SEPARATORS or ord(c) < 33 or ord(c) > 126 for c in value)


def format_media_type(media_type: str, params: Mapping[str, str] | None = None) -> str:
    """Build a Content-Type / Accept value, quoting parameter values when needed.

    ``type`` parameters are always quoted (PS3.18 examples quote them; the
    ``/`` in a media type is a separator, so quoting is required).
    """
    parts = [media_type]
    for name, val in (params or {}).items():
        if _needs_quotes(val):
            val = '"' + val.replace("\\", "\\\\").replace('"', '\\"') + '"'
        parts.append(f"{name}={val}")
    return "; ".join(parts)
