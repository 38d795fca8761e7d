"""Settings that cannot be absurd (config_values.py): every number of the settings, the
routes file and the peers file has a range; headers are RFC 9110 fields; names are one
printable line; AE titles are PS3.5 AE values. A bad value stops ``serve`` at start with
exit status 2 and one line naming the file, the line or field, and what is allowed.

Seen: ``[delivery] concurrency = 100000`` was accepted (each worker then sat at ~700 MB
and a full core and did not stop on SIGTERM within 15 s), as were a lease shorter than
the timeout, a header value with CR LF and a destination name with a newline."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import pytest
from pydantic import ValidationError

from dicomweb_server.dimse.peers import Peer, PeersError, load_peers
from dicomweb_server.routing.rules import DELIVERY_BOUNDS, Delivery, RoutesError, load_routes
from dicomweb_server.settings import Settings, error_lines, field_bound

DEST = '[[destinations]]\nname = "pacs"\nstow_url = "http://127.0.0.1:9/dicom-web"\n'
RULE = '[[rules]]\ndestinations = ["pacs"]\n'


def _serve(tmp_path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dicomweb_server.cli", "serve", "--data-dir", str(tmp_path / "d"),
                           "--port", "0", *args], env={**os.environ, **(env or {})},
                          capture_output=True, text=True, timeout=60, check=False)


# --- through the real command line ---------------------------------------------------------


@pytest.mark.parametrize("args, env, words", [
    (["--port", "70000"], {}, "port (DICOMWEB_PORT): 70000 is out of range; allowed: an integer from 0 to 65535"),
    (["--workers", "100000"], {},
     "workers (DICOMWEB_WORKERS): 100000 is out of range; allowed: an integer from 1 to 256"),
    ([], {"DICOMWEB_SHUTDOWN_TIMEOUT": "0"},
     "shutdown_timeout (DICOMWEB_SHUTDOWN_TIMEOUT): 0 is out of range; allowed: a number above 0, at most 3600"),
    ([], {"DICOMWEB_BODY_TIMEOUT": "inf"}, "body_timeout (DICOMWEB_BODY_TIMEOUT): inf is out of range"),
    (["--dimse-max-associations", "0"], {}, "dimse_max_associations (DICOMWEB_DIMSE_MAX_ASSOCIATIONS): 0 is out of"),
    (["--ae-title", "BAD\\AE"], {}, "ae_title (DICOMWEB_AE_TITLE): 'BAD\\\\AE': an AE title is printable ASCII"),
])
def test_serve_refuses_a_setting_out_of_range(tmp_path, args, env, words):
    r = _serve(tmp_path, *args, env=env)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == f"dicomweb-server: {words}" or words in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


@pytest.mark.parametrize("env, words", [
    ({"DICOMWEB_CORS_ORIGINS": "https://viewer.example"},
     "cors_origins (DICOMWEB_CORS_ORIGINS): 'https://viewer.example' is not JSON (Expecting value: line 1 column 1 "
     "(char 0)); give a JSON list, e.g. DICOMWEB_CORS_ORIGINS='[\"https://viewer.example\"]'"),
    ({"dicomweb_dimse_allowed_aes": "CT1, MR1"},
     "dimse_allowed_aes (DICOMWEB_DIMSE_ALLOWED_AES): 'CT1, MR1' is not JSON (Expecting value: line 1 column 1 "
     "(char 0)); give a JSON list, e.g. DICOMWEB_DIMSE_ALLOWED_AES='[\"CT1\", \"MR1\"]'"),
    ({"DICOMWEB_API_KEYS": "token-of-the-site"},  # a secret: not repeated in the line (journals keep stderr)
     "api_keys (DICOMWEB_API_KEYS): the value given (not shown: it holds secrets) is not JSON (Expecting value: "
     "line 1 column 1 (char 0)); "
     "give a JSON object, e.g. DICOMWEB_API_KEYS='{\"my-secret-token\": [\"read\", \"write\", \"delete\"]}'"),
    ({"DICOMWEB_ACCESS_RULES": "{bad"},
     "access_rules (DICOMWEB_ACCESS_RULES): '{bad' is not JSON (Expecting property name enclosed in double quotes: "
     "line 1 column 2 (char 1)); give a JSON object, e.g. "
     "DICOMWEB_ACCESS_RULES='{\"identities\": {\"basic:alice\": [\"cardio\"]}, \"default\": \"*\"}'"),
])
@pytest.mark.parametrize("command", ["serve", "import"])
def test_a_list_or_mapping_variable_that_is_not_json_is_one_line(tmp_path, env, words, command):
    """pydantic-settings json.loads these variables before validation: a plain value was a
    SettingsError traceback (exit 1) that named neither the form wanted nor an example
    (a new user's trial: ``DICOMWEB_CORS_ORIGINS=https://viewer.example``)."""
    args = ["--port", "0"] if command == "serve" else ["--samples"]
    r = subprocess.run([sys.executable, "-m", "dicomweb_server.cli", command, "--data-dir", str(tmp_path / "d"), *args],
                       env={**os.environ, **env}, capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == f"dicomweb-server: {words}", r.stderr
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize("body, words", [
    (DEST + RULE + "[delivery]\nconcurrency = 100000\n",
     "line 7: [delivery] concurrency: 100000 is out of range; allowed: an integer from 1 to 64"),
    (DEST + RULE + "[delivery]\nbatch_size = 100000000\n",
     "line 7: [delivery] batch_size: 100000000 is out of range; allowed: an integer from 1 to 1000"),
    (DEST + RULE + "[delivery]\ntimeout = 60\nlease = 30\n",
     "line 8: [delivery] lease: lease (30 s) must be at least twice timeout (60 s)"),
    (DEST.replace("\n[[", "").replace('dicom-web"\n', 'dicom-web"\nheaders = { Authorization = "x\\r\\nHost: evil" }\n')
     + RULE, "line 4: [[destinations]] #1 headers: Authorization: 'x\\r\\nHost: evil' is not a header field value"),
    ('[[destinations]]\nname = "pa\\ncs"\nstow_url = "http://127.0.0.1:9/"\n' + RULE.replace("pacs", "pa\\ncs"),
     "line 2: [[destinations]] #1 name: 'pa\\ncs' must be printable on one line"),
])
def test_serve_refuses_a_routes_file_value(tmp_path, body, words):
    f = tmp_path / "routes.toml"
    f.write_text(body)
    r = _serve(tmp_path, "--routes", str(f))
    assert r.returncode == 2, r.stderr
    assert f"{f}: {words}" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


@pytest.mark.parametrize("text, words", [
    ('{"STORESCP": {"host": "127.0.0.1", "port": 70000}}',
     "'STORESCP': port: 70000 is out of range; allowed: an integer from 1 to 65535"),
    ('{"A_TITLE_OF_17_CHR": {"host": "127.0.0.1", "port": 104}}',
     "'A_TITLE_OF_17_CHR' is longer than the 16 characters of an AE title"),
])
def test_serve_refuses_a_peers_file_value(tmp_path, text, words):
    f = tmp_path / "peers.json"
    f.write_text(text)
    r = _serve(tmp_path, "--dimse-peers-file", str(f))
    assert r.returncode == 2, r.stderr
    assert f"peers file {f}: {words}" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


# --- the main settings ---------------------------------------------------------------------


def test_every_numeric_setting_has_a_range_holding_its_default():
    numeric = [n for n, f in Settings.model_fields.items() if f.annotation in (int, float, int | None, float | None)]
    assert len(numeric) >= 24
    for name in numeric:
        bound = field_bound(name)
        assert bound is not None, f"{name} has no range"
        default = Settings.model_fields[name].default
        assert default is None or bound.problem(default) is None, name


@pytest.mark.parametrize("name, value, words", [
    ("port", -1, "-1 is out of range; allowed: an integer from 0 to 65535"),
    ("dimse_port", 65536, "65536 is out of range"),
    ("workers", 0, "0 is out of range; allowed: an integer from 1 to 256"),
    ("database_pool_size", 1000, "1000 is out of range; allowed: an integer from 1 to 100"),
    ("max_request_bytes", 10, "10 is out of range; allowed: an integer from 1024 to 1099511627776"),
    ("max_parts", 0, "allowed: an integer from 1 to 1000000"),
    ("body_timeout", 0, "allowed: a number above 0, at most 3600"),
    ("body_timeout", float("nan"), "nan is out of range"),
    ("body_min_rate", 0, "allowed: an integer from 1 to"),
    ("header_timeout", 601, "allowed: a number above 0, at most 600"),
    ("max_header_bytes", 100, "allowed: an integer from 1024 to 1048576"),
    ("max_results", 10**6, "allowed: an integer from 1 to 100000"),
    ("bulk_threshold", -1, "allowed: an integer from 0 to 4294967294"),
    ("render_cache_bytes", 2**40, "allowed: an integer from 0 to 68719476736"),
    ("decode_processes", 1000, "allowed: an integer from 1 to 64"),
    ("decode_timeout", -5, "allowed: a number above 0"),
    ("shutdown_timeout", 1e9, "allowed: a number above 0, at most 3600"),
    ("oidc_jwks_timeout", 0, "allowed: a number above 0, at most 300"),
    ("oidc_jwks_cache_seconds", -1, "allowed: a number from 0 to 604800"),
    ("dimse_max_associations", 100000, "allowed: an integer from 1 to 1000"),
    ("dimse_processes", 65, "allowed: an integer from 0 to 64"),
    ("dimse_acse_timeout", 0, "allowed: a number above 0"),
    ("dimse_timeout", 0, "allowed: a number above 0"),
    ("dimse_network_timeout", float("inf"), "inf is out of range"),
    ("dimse_max_pdu", 100, "100 is out of range; allowed: 0 or an integer from 4096 to 4294967295"),
    ("dimse_max_pdu", 2**32, "allowed: 0 or an integer from 4096 to 4294967295"),
    ("max_parts", "many", "'many': input should be a valid integer"),
    ("ae_title", "", "'' is not an AE title: empty or all spaces"),
    ("ae_title", "    ", "is not an AE title: empty or all spaces"),
    ("ae_title", "SEVENTEEN_CHARS_X", "longer than the 16 characters"),
    ("ae_title", "TAB\tAE", "without backslash or control characters"),
    ("ae_title", "ÄRCHIV", "printable ASCII"),
    ("dimse_allowed_aes", ["OK", "NEW\nLINE"], "printable ASCII"),
    ("host", "127.0.0.1 ", "not a host name or IP address"),
    ("host", "http://example.org", "not a host name or IP address"),
    ("host", "", "a host name or IP address is required"),
])
def test_a_setting_out_of_range_names_itself_and_what_is_allowed(name, value, words):
    with pytest.raises(ValidationError) as e:
        Settings(**{name: value})
    (line,) = error_lines(e.value)
    assert line.startswith(f"{name} (DICOMWEB_{name.upper()}): ") and words in line, line


@pytest.mark.parametrize("name, value", [
    ("port", 0), ("port", 65535), ("dimse_max_pdu", 0), ("dimse_max_pdu", 4096), ("bulk_threshold", 0),
    ("host", "::1"), ("host", "0.0.0.0"), ("host", "archive.example.org"), ("host", "dicom_pacs"),
    ("ae_title", " PACS "), ("ae_title", "A" * 16), ("dimse_allowed_aes", ["STORESCU", "X-1"]),
    ("header_timeout", 0.5), ("oidc_jwks_cache_seconds", 0),
])
def test_values_within_range_are_kept(name, value):
    assert getattr(Settings(**{name: value}), name) == value


# --- the routes file -----------------------------------------------------------------------


def test_every_delivery_setting_has_a_range_holding_its_default():
    assert set(DELIVERY_BOUNDS) == {f.name for f in dataclasses.fields(Delivery)}
    for f in dataclasses.fields(Delivery):
        assert DELIVERY_BOUNDS[f.name].problem(f.default) is None, f.name


_DELIVERY_BAD = [
    ("batch_size", "0", "0 is out of range; allowed: an integer from 1 to 1000"),
    ("batch_size", "1001", "1001 is out of range"),
    ("batch_size", "1e8", "100000000.0 is not an integer; allowed: an integer from 1 to 1000"),
    ("concurrency", "100000", "100000 is out of range; allowed: an integer from 1 to 64"),
    ("concurrency", "2.5", "2.5 is not an integer"),
    ("max_attempts", "0", "allowed: an integer from 1 to 1000000"),
    ("max_attempts", "true", "True is not a number"),
    ("max_age", "0", "allowed: a number from 1 to 31536000"),
    ("max_age", "inf", "inf is out of range"),
    ("backoff_base", "-1", "allowed: a number from 0.001 to 3600"),
    ("backoff_base", "nan", "nan is out of range"),
    ("backoff_max", "1e6", "allowed: a number from 0.001 to 86400"),
    ("poll_interval", "0.001", "allowed: a number from 0.05 to 300"),
    ("poll_interval", '"1"', "'1' is not a number"),
    ("lease", "100000", "allowed: a number from 1 to 86400"),
    ("timeout", "0", "allowed: a number from 0.1 to 3600"),
    ("keep_delivered", "-86400", "allowed: a number from 1 to 31536000"),
    ("colour", "1", "unknown; known: batch_size, concurrency"),
]


@pytest.mark.parametrize("key, value, words", _DELIVERY_BAD, ids=[f"{k}={v}" for k, v, _ in _DELIVERY_BAD])
def test_a_delivery_value_out_of_range_is_refused_naming_line_and_range(tmp_path, key, value, words):
    f = tmp_path / "routes.toml"
    # the destination's dimse table has a `port`, rules have `name`s: the line is found in [delivery]
    f.write_text(DEST + RULE + f"[delivery]\nbatch_size = 5\n{key} = {value}\n" if key != "batch_size"
                 else DEST + RULE + f"[delivery]\nlease = 120\n{key} = {value}\n")
    with pytest.raises(RoutesError) as e:
        load_routes(f)
    assert str(e.value).startswith(f"{f}: line 8: [delivery] {key}: ") and words in str(e.value), str(e.value)


@pytest.mark.parametrize("delivery, line, words", [
    ("timeout = 61\n", 7, "timeout: lease (120 s) must be at least twice timeout (61 s)"),
    ("lease = 119\n", 7, "lease: lease (119 s) must be at least twice timeout (60 s)"),
    ("timeout = 10\nlease = 19.5\n", 8, "lease (19.5 s) must be at least twice timeout (10 s)"),
    ("backoff_base = 10\nbackoff_max = 5\n", 8, "backoff_max: backoff_max (5 s) must be at least backoff_base (10 s)"),
    ("backoff_base = 400\n", 7, "backoff_base: backoff_max (300 s) must be at least backoff_base (400 s)"),
])
def test_delivery_cross_field_rules(tmp_path, delivery, line, words):
    f = tmp_path / "routes.toml"
    f.write_text(DEST + RULE + "[delivery]\n" + delivery)
    with pytest.raises(RoutesError) as e:
        load_routes(f)
    assert f"line {line}: [delivery] " in str(e.value) and words in str(e.value), str(e.value)


def test_delivery_within_the_rules_is_kept(tmp_path):
    f = tmp_path / "routes.toml"
    f.write_text(DEST + RULE + "[delivery]\ntimeout = 10\nlease = 20\nconcurrency = 64\nbatch_size = 1000\n"
                 "backoff_base = 2\nbackoff_max = 2\nmax_attempts = 100000\n")
    d = load_routes(f).delivery
    assert (d.timeout, d.lease, d.concurrency, d.batch_size, d.backoff_max, d.max_attempts) == \
        (10, 20, 64, 1000, 2, 100000)


def _dest(fields: str) -> str:
    return f'[[destinations]]\n{fields}\n[[rules]]\ndestinations = ["pacs"]\n'


_DESTINATION_BAD = [
    ('name = "pacs"\nstow_url = "http://h/"\nheaders = { "X-A" = "a\\r\\nX-B: b" }', "headers",
     "X-A: 'a\\r\\nX-B: b' is not a header field value"),
    ('name = "pacs"\nstow_url = "http://h/"\nheaders = { "X-A" = "a\\nb" }', "headers", "not a header field value"),
    ('name = "pacs"\nstow_url = "http://h/"\nheaders = { "X-A" = "a\\u0000b" }', "headers", "no CR, LF, NUL"),
    ('name = "pacs"\nstow_url = "http://h/"\nheaders = { "X-A" = " padded" }', "headers", "not a header field value"),
    ('name = "pacs"\nstow_url = "http://h/"\nheaders = { "X-A" = "é" }', "headers", "visible ASCII"),
    ('name = "pacs"\nstow_url = "http://h/"\nheaders = { "Bad Name" = "v" }', "headers",
     "'Bad Name' is not a header field name"),
    ('name = "pacs"\nstow_url = "http://h/"\nheaders = { "X-A:" = "v" }', "headers", "is not a header field name"),
    ('name = "pacs"\nstow_url = "http://h/"\nheaders = { "" = "v" }', "headers", "is not a header field name"),
    ('name = "pacs"\nstow_url = "http://h/"\nheaders = { "Content-Length" = "5" }', "headers",
     "Content-Length is set by the sender itself"),
    ('name = "pacs"\nstow_url = "http://h/"\nheaders = { "transfer-encoding" = "chunked" }', "headers",
     "set by the sender itself"),
    ('name = "pacs"\nstow_url = "http://h/"\nheaders = { "X-A" = "1", "x-a" = "2" }', "headers", "x-a is given twice"),
    ('name = "pacs"\nstow_url = "http://h/"\nheaders = { "X-A" = 1 }', "headers", "the value must be a string"),
    ('name = "pacs"\nstow_url = "http://h/"\nheaders = { "X-A" = "' + "v" * 9000 + '" }', "headers",
     "longer than 8192 characters"),
    ('name = "pa\\ncs"\nstow_url = "http://h/"', "name", "'pa\\ncs' must be printable on one line"),
    ('name = "pa\\tcs"\nstow_url = "http://h/"', "name", "must be printable on one line"),
    ('name = " pacs"\nstow_url = "http://h/"', "name", "must not begin or end with spaces"),
    ('name = ""\nstow_url = "http://h/"', "name", "a non-empty string is required"),
    ('name = "' + "p" * 129 + '"\nstow_url = "http://h/"', "name", "longer than 128 characters"),
    ('name = "pacs"\nstow_url = "http://h/\\r\\nX: y"', "stow_url", "is not an http(s) URL (on one line"),
    ('name = "pacs"\nstow_url = "http://h /x"', "stow_url", "without spaces"),
    ('name = "pacs"\nstow_url = "http://h:99999/"', "stow_url", "out of range"),
    ('name = "pacs"\nstow_url = "http://:80/"', "stow_url", "is not an http(s) URL"),
    ('name = "pacs"\ndimse = { ae_title = "PACS", host = "h", port = 0 }', "dimse",
     "port: 0 is out of range; allowed: an integer from 1 to 65535"),
    ('name = "pacs"\ndimse = { ae_title = "PACS", host = "h", port = 70000 }', "dimse", "port: 70000 is out of range"),
    ('name = "pacs"\ndimse = { ae_title = "PACS", host = "h", port = true }', "dimse", "port: True is not a number"),
    ('name = "pacs"\ndimse = { ae_title = "PACS", host = "h", port = 104.5 }', "dimse",
     "port: 104.5 is not an integer"),
    ('name = "pacs"\ndimse = { ae_title = "PACS", host = "h\\nx", port = 104 }', "dimse",
     "host: 'h\\nx' is not a host name"),
    ('name = "pacs"\ndimse = { ae_title = "PACS", host = "", port = 104 }', "dimse", "host: a host name"),
    ('name = "pacs"\ndimse = { ae_title = "    ", host = "h", port = 104 }', "dimse",
     "ae_title: '    ' is not an AE title: empty or all spaces"),
    ('name = "pacs"\ndimse = { ae_title = "PA\\\\CS", host = "h", port = 104 }', "dimse",
     "ae_title: 'PA\\\\CS': an AE title is printable ASCII without backslash"),
    ('name = "pacs"\ndimse = { ae_title = "PACS", calling_ae_title = "ME\\u0007", host = "h", port = 104 }',
     "dimse", "calling_ae_title: 'ME\\x07'"),
]


@pytest.mark.parametrize("fields, key, words", _DESTINATION_BAD)
def test_a_bad_destination_is_refused_naming_line_and_field(tmp_path, fields, key, words):
    f = tmp_path / "routes.toml"
    f.write_text(_dest(fields))
    with pytest.raises(RoutesError) as e:
        load_routes(f)
    line = next(n for n, ln in enumerate(f.read_text().splitlines(), 1) if ln.startswith(f"{key} ="))
    assert f"{f}: line {line}: [[destinations]] #1 {key}: " in str(e.value) and words in str(e.value), str(e.value)


@pytest.mark.parametrize("name, words", [
    ('"every\\nthing"', "'every\\nthing' must be printable on one line"),
    ('"\\u001b[31mred"', "must be printable on one line"),
    ("5", "a non-empty string is required"),
])
def test_a_rule_name_must_be_one_printable_line(tmp_path, name, words):
    f = tmp_path / "routes.toml"
    f.write_text(DEST + f'[[rules]]\nname = {name}\ndestinations = ["pacs"]\n')
    with pytest.raises(RoutesError) as e:
        load_routes(f)
    assert "line 5: [[rules]] #1 name: " in str(e.value) and words in str(e.value), str(e.value)


def test_good_headers_names_and_addresses_are_kept(tmp_path):
    f = tmp_path / "routes.toml"
    f.write_text('[[destinations]]\nname = "PACS (main)"\nstow_url = "https://[::1]:8443/dicom-web/"\n'
                 'headers = { Authorization = "Bearer abc.def-ghi_~+/=", "X-Tenant" = "a b\\tc" }\n'
                 '[[destinations]]\nname = "modality"\n'
                 'dimse = { ae_title = " CT1 ", host = "ct-1.example.org", port = 104 }\n'
                 '[[rules]]\ndestinations = ["PACS (main)", "modality"]\n')
    routes = load_routes(f)
    main = routes.destinations["PACS (main)"]
    assert (main.stow_url, main.headers) == ("https://[::1]:8443/dicom-web",
                                             {"Authorization": "Bearer abc.def-ghi_~+/=", "X-Tenant": "a b\tc"})
    assert routes.destinations["modality"].dimse.ae_title == "CT1"


# --- the peers file ------------------------------------------------------------------------


@pytest.mark.parametrize("text, words", [
    ('{"STORESCP": {"host": "h", "port": 0}}', "'STORESCP': port: 0 is out of range; allowed: an integer from 1"),
    ('{"STORESCP": {"host": "h", "port": "104"}}', "'STORESCP': port: '104' is not a number"),
    ('{"STORESCP": {"host": "h", "port": true}}', "port: True is not a number"),
    ('{"STORESCP": {"host": "h", "port": null}}', "'STORESCP': port: None is not a number"),
    ('{"STORESCP": {"host": "h", "scopes": ["admin"]}}', "'STORESCP': scopes must be a list of 'read' and 'write'"),
    ('{"STORESCP": {"host": "a b", "port": 104}}', "'STORESCP': host: 'a b' is not a host name"),
    ('{"STORESCP": {"host": "h\\r\\nx", "port": 104}}', "host: 'h\\r\\nx' is not a host name"),
    ('{"STORESCP": {"port": 104}}', "'STORESCP': host: a host name or IP address is required"),
    ('{"   ": {"host": "h", "port": 104}}', "'   ' is not an AE title: empty or all spaces"),
    ('{"": {"host": "h", "port": 104}}', "'' is not an AE title: empty"),
    ('{"A\\\\B": {"host": "h", "port": 104}}', "an AE title is printable ASCII without backslash"),
    ('{"A\\nB": {"host": "h", "port": 104}}', "without backslash or control characters"),
    ('{"SEVENTEEN_CHARS_X": {"host": "h", "port": 104}}', "longer than the 16 characters"),
    ('{"PACS": {"host": "h", "port": 104}, " PACS": {"host": "h", "port": 105}}', "' PACS': given twice"),
    ('{"PACS": 104}', "'PACS': expected {host, port, scopes}"),
])
def test_a_bad_peer_is_refused_naming_it_and_what_is_allowed(tmp_path, text, words):
    f = tmp_path / "peers.json"
    f.write_text(text)
    with pytest.raises(PeersError) as e:
        load_peers(f)
    assert str(e.value).startswith(f"peers file {f}: ") and words in str(e.value), str(e.value)


def test_good_peers_are_kept(tmp_path):
    f = tmp_path / "peers.toml"
    f.write_text('[" STORESCP "]\nhost = "fe80::1"\nport = 65535\n[ARCHIVE2]\nhost = "archive-2.local"\nport = 1\n'
                 '[MODALITY]\nhost = "10.1.2.3"\nscopes = ["write"]\n')  # no port: not a Move Destination
    assert load_peers(f) == {"STORESCP": Peer("STORESCP", "fe80::1", 65535),
                             "ARCHIVE2": Peer("ARCHIVE2", "archive-2.local", 1),
                             "MODALITY": Peer("MODALITY", "10.1.2.3", None, frozenset({"write"}))}
