"""Client bytes never reach a response header unescaped (issue 14 §3, "500s and
dropped connections"): a control character in a stored UID was echoed into the
Warning header and uvicorn dropped the connection after part of the request had
been committed. Warning values are quoted-strings of visible ASCII (RFC 9110 §5.5,
§5.6.4); the JSON body keeps the exact text."""

from __future__ import annotations

import re
import urllib.parse

import httpx
import pytest

from dicomweb_server.api.errors import safe_header_value, warning_header
from tests.helpers import make_dataset, multipart, to_bytes

NASTY = ['ctl\x01\x7f', 'quote"back\\slash', "crlf\r\nX-Injected: 1", "non-ascii é€ 𝄞", "percent %41 %", "tab\tsp"]
_WARNING = re.compile(r'299 dicomweb-archive: "((?:[^"\\]|\\[\t\x20-\x7e])*)"')


def warning_text(value: str) -> str:
    """The text of one of our Warning values: unquote (RFC 9110 §5.6.4), percent-decode."""
    m = _WARNING.fullmatch(value)
    assert m, value
    return urllib.parse.unquote(re.sub(r"\\(.)", r"\1", m.group(1)))


def _field_safe(value: str) -> bool:
    return all(c == "\t" or " " <= c <= "~" for c in value)


@pytest.mark.parametrize("text", NASTY)
def test_warning_header_round_trips_any_text(text):
    value = warning_header(text)
    assert _field_safe(value)
    assert warning_text(value) == text


def test_safe_header_value_escapes_everything_outside_field_characters():
    assert safe_header_value(b"a b\tc~") == b"a b\tc~"
    assert safe_header_value(b"x\r\ny\x00\xe9") == b"x%0D%0Ay%00%E9"


def test_control_characters_in_a_stored_uid_do_not_drop_the_connection(server):
    """Good parts are stored and acknowledged; the bad part's UID comes back escaped."""
    good = make_dataset()
    parts = [to_bytes(good)]
    for text in NASTY:
        raw = text.encode()
        ds = make_dataset(study=good.StudyInstanceUID, sop="1.2." + "9" * len(raw))
        # pydicom refuses to write such a UID: put the bytes into the file directly
        parts.append(to_bytes(ds).replace(b"9" * len(raw), raw))
    body, ctype = multipart(parts)
    with httpx.Client(base_url=server.url, timeout=60) as c:
        r = c.post("/studies", content=body, headers={"content-type": ctype})
        assert r.status_code == 202, r.text
        stored = r.json()["00081199"]["Value"]
        assert [s["00081155"]["Value"][0] for s in stored] == [good.SOPInstanceUID]
        assert len(r.json()["00081198"]["Value"]) == len(NASTY)
        assert _field_safe(r.headers["warning"])
        text = warning_text(r.headers["warning"])
        assert "1.2.ctl\x01\x7f" in text or "1.2.ctl\x01\x7f".encode().decode("unicode_escape") in text, text
        assert "x-injected" not in r.headers
        assert c.get(f"/studies/{good.StudyInstanceUID}/metadata").status_code == 200


@pytest.mark.parametrize("text", NASTY)
def test_client_text_in_error_messages_is_escaped_in_the_header_and_exact_in_the_body(server, text):
    with httpx.Client(base_url=server.url, timeout=60) as c:
        # a query value and a part Content-Type, both echoed by their error messages
        r = c.get("/studies", params={"StudyDate": text})
        assert r.status_code == 400
        assert _field_safe(r.headers["warning"])
        assert warning_text(r.headers["warning"]) == r.json()["detail"]
        assert r.json()["detail"].startswith("StudyDate")
        # a part's Content-Type (inside the body: no HTTP parser checks it)
        body, ctype = multipart([(f'text/{text}; x="{text}"', b"not dicom")])
        r = c.post("/studies", content=body, headers={"content-type": ctype})
        assert r.status_code in (400, 409), r.text
        assert _field_safe(r.headers["warning"])
        assert warning_text(r.headers["warning"])
