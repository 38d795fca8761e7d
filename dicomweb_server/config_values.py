"""What a setting or a configuration file may hold: numeric ranges, AE titles (PS3.5),
HTTP field names and values (RFC 9110), host names, and the names of rules and
destinations.

One place for the checks that ``settings.py`` (flags and ``DICOMWEB_*`` variables),
``routing/rules.py`` (the routes file) and ``dimse/peers.py`` (the peers file) make at
start: a bad value is refused there, with exit status 2 and one line naming the file,
the line or field, and what is allowed. Seen before: ``[delivery] concurrency = 100000``
was accepted (each worker then sat at ~700 MB and a full core, deaf to SIGTERM), as were
a header value with CR LF and a destination name with a newline.

Each function returns why a value is refused (a phrase to put after the field's name),
or None when it is fine.
"""

from __future__ import annotations

import ipaddress
import math
import re
from dataclasses import dataclass


def _num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else f"{v:g}"


@dataclass(frozen=True, slots=True)
class Bound:
    """An allowed range: ``lo <= value <= hi`` (``lo < value`` when ``lo_open``), whole
    numbers only when ``integer``; ``or_zero``: 0 is allowed as well (it means "off" or
    "unlimited")."""

    lo: float
    hi: float
    integer: bool = False
    lo_open: bool = False
    or_zero: bool = False

    def describe(self) -> str:
        kind = "an integer" if self.integer else "a number"
        if self.lo_open:
            text = f"{kind} above {_num(self.lo)}, at most {_num(self.hi)}"
        else:
            text = f"{kind} from {_num(self.lo)} to {_num(self.hi)}"
        return f"0 or {text}" if self.or_zero else text

    def problem(self, value: object) -> str | None:
        """Why ``value`` (as parsed from TOML or JSON) is refused, or None."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"{value!r} is not a number; allowed: {self.describe()}"
        if self.integer and not isinstance(value, int):
            return f"{value!r} is not an integer; allowed: {self.describe()}"
        if self.or_zero and value == 0:
            return None
        if not math.isfinite(value) or value < self.lo or value > self.hi or (self.lo_open and value == self.lo):
            return f"{_num(value) if math.isfinite(value) else value} is out of range; allowed: {self.describe()}"
        return None


#: TCP ports a peer listens on (port 0 is no port to connect to)
PORT = Bound(1, 65535, integer=True)


def ae_title_problem(value: object) -> str | None:
    """PS3.5 §6.2, Table 6.2-1, AE: at most 16 characters of the Default Character
    Repertoire (ISO-IR 6: printable ASCII) without backslash (5CH) or control
    characters; leading and trailing spaces are not significant; a value of spaces
    only shall not be used."""
    if not isinstance(value, str):
        return f"{value!r} is not an AE title (a string of 1-16 characters, PS3.5 AE)"
    if not value.strip(" "):
        return f"{value!r} is not an AE title: empty or all spaces (PS3.5 AE)"
    if len(value) > 16:
        return f"{value!r} is longer than the 16 characters of an AE title (PS3.5 AE)"
    if any(not " " <= c <= "~" for c in value) or "\\" in value:
        return f"{value!r}: an AE title is printable ASCII without backslash or control characters (PS3.5 AE)"
    return None


#: RFC 9110 §5.6.2 token (a field name, §5.1)
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
#: RFC 9110 §5.5 field value: visible US-ASCII, spaces and tabs inside (no CR, LF, NUL,
#: other controls; no leading or trailing white space; obs-text is not generated)
_FIELD_VALUE = re.compile(r"(?:[!-~](?:[ \t!-~]*[!-~])?)?")
#: header fields the senders set themselves (message framing and connection: RFC 9112
#: §6, RFC 9110 §7.2, §7.6.1); one given in a routes file would contradict them
SENDER_FIELDS = frozenset({"content-length", "transfer-encoding", "content-type", "host", "connection",
                           "keep-alive", "proxy-connection", "te", "trailer", "upgrade"})
#: characters of one header field value
MAX_FIELD_VALUE = 8192


def header_problem(name: object, value: object) -> str | None:
    """One HTTP header field a routes file asks to send (RFC 9110 §5)."""
    if not isinstance(name, str) or not _TOKEN.fullmatch(name):
        return f"{name!r} is not a header field name (a token: letters, digits and !#$%&'*+-.^_`|~; RFC 9110 §5.1)"
    if name.lower() in SENDER_FIELDS:
        return f"{name} is set by the sender itself (message framing and connection) and cannot be given"
    if not isinstance(value, str):
        return f"{name}: the value must be a string"
    if len(value) > MAX_FIELD_VALUE:
        return f"{name}: the value is longer than {MAX_FIELD_VALUE} characters"
    if not _FIELD_VALUE.fullmatch(value):
        return (f"{name}: {value!r} is not a header field value (visible ASCII, with spaces or tabs only "
                "inside: no CR, LF, NUL or other control characters; RFC 9110 §5.5)")
    return None


#: characters of a destination's or a rule's name
MAX_NAME = 128


def name_problem(value: object) -> str | None:
    """A destination's or rule's name: it is written in logs, the outbox, ``queue``'s
    table and metric labels, so one printable line, without leading or trailing spaces."""
    if not isinstance(value, str) or not value:
        return "a non-empty string is required"
    if len(value) > MAX_NAME:
        return f"{value[:20]!r}... is longer than {MAX_NAME} characters"
    if not value.isprintable():
        return f"{value!r} must be printable on one line (no newline, tab or control characters)"
    if value != value.strip():
        return f"{value!r} must not begin or end with spaces"
    return None


_LABEL = r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
#: RFC 1123 §2.1 host names (underscores too: container and service names have them)
_HOST_NAME = re.compile(rf"{_LABEL}(?:\.{_LABEL})*\.?")


def host_problem(value: object) -> str | None:
    """A host name (RFC 1123 §2.1) or an IPv4/IPv6 address, without brackets or port."""
    if not isinstance(value, str) or not value:
        return "a host name or IP address is required"
    try:
        ipaddress.ip_address(value)
        return None
    except ValueError:
        pass
    if len(value) > 253 or not _HOST_NAME.fullmatch(value):
        return f"{value!r} is not a host name or IP address (no scheme, port, brackets or spaces)"
    return None
