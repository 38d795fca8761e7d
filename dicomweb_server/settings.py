"""Archive configuration: one pydantic-settings model; every field is also an
environment variable with the prefix ``DICOMWEB_`` (e.g. ``DICOMWEB_DATA_DIR``),
and the ``dicomweb-server`` command line maps its flags onto the same fields."""

from __future__ import annotations

import json
import os
import re
import typing
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict, SettingsError

from .config_values import Bound, ae_title_problem, host_problem
from .dicom.charset import configured


#: ``dimse_max_pdu``: 0 (no limit) or 4096 bytes up to the 32 bits of PS3.8 §D.1
MAX_PDU = Bound(4096, 2**32 - 1, integer=True, or_zero=True)


class Settings(BaseSettings):
    """Configuration of one archive process.

    Units: sizes in bytes, times in seconds. Every number has a range (``ge``/``gt`` and
    ``le``): a value outside it is refused at start (:func:`error_lines`), not met
    later as a worker that cannot start or a limit that cannot hold.
    """

    model_config = SettingsConfigDict(env_prefix="DICOMWEB_", extra="ignore")

    host: str = Field("127.0.0.1", description="listen address (HTTP and DIMSE); any address but loopback needs "
                                               "authentication or `insecure`")
    port: int = Field(8080, ge=0, le=65535, description="HTTP listen port")
    data_dir: Path = Field(Path("./data"), description="the data folder: stored files (`blobs/`), spool (`tmp/`), "
                                                      "`index.sqlite`")
    index: Literal["sqlite", "memory", "postgresql"] = Field(
        "sqlite", description="metadata index: `sqlite` (embedded), `memory` (rebuilt from the files at start-up) "
                              "or `postgresql` (several nodes sharing one index: see Scale out)")
    database_url: str | None = Field(
        None, description="PostgreSQL index: `postgresql://user@host:port/db` (a libpq URL)")
    database_pool_size: int = Field(
        8, ge=1, le=100, description="PostgreSQL read connections per worker process; as many again hold stores' "
                             "placement locks, plus one writer: the server's `max_connections` must cover "
                             "nodes x workers x (2 x this + 1)")
    storage: str | None = Field(
        None, description="where instances are kept: `s3://bucket/prefix` (S3-compatible object storage, see "
                          "Scale out); default: the data folder's `blobs/`")
    s3_endpoint_url: str | None = Field(
        None, description="S3 endpoint, e.g. `http://minio:9000` (MinIO, Ceph RGW); default: AWS. Credentials "
                          "and region from the standard `AWS_*` variables")
    workers: int | None = Field(None, ge=1, le=256, description="worker processes; default: one per core with sqlite, "
                                                        "1 with memory (which refuses more than one)")
    balance_connections: bool = Field(True, description="with several workers, a worker that accepts a "
                                      "connection while it holds more than the least loaded worker passes it "
                                      "to that one (keep-alive connections spread evenly: api/balance.py)")
    prefix: str = Field("", description="path prefix DICOMweb is served under, e.g. `/dicomweb`")
    public_url: str | None = Field(
        None, description="base URL written into RetrieveURL and BulkDataURI; default: from the request"
    )
    max_request_bytes: int = Field(4 * 1024**3, ge=1024, le=1024**4, description="STOW-RS body cap (413)")
    max_parts: int = Field(10_000, ge=1, le=1_000_000, description="STOW-RS parts per request cap (413)")
    body_timeout: float = Field(60.0, gt=0, le=3600, description="seconds a STOW-RS body may stall (408)")
    body_min_rate: int = Field(
        10240, ge=1, le=10 * 1024**3, description="STOW-RS total body deadline: `body_timeout` + bytes received / this rate in "
                                 "bytes/s (408); a 100 MB body may take 60 s + 2.7 h")
    header_timeout: float = Field(10.0, gt=0, le=600, description="seconds to receive a request line and headers "
                                                          "(408, connection closed)")
    max_header_bytes: int = Field(65536, ge=1024, le=1024**2, description="request line + headers cap: 414 (request line) "
                                                              "or 431, counted while they arrive; connection closed")
    max_results: int = Field(1000, ge=1, le=100_000, description="QIDO-RS maximum (and default) `limit`")
    keep_versions: float = Field(30.0, ge=0, le=36500, description="days the earlier versions of an updated "
                                 "instance are kept after they were replaced (lifecycle/versions.py; then removed at start-up, "
                                 "hourly, by `purge` and `check --repair`)")
    duplicate_policy: Literal["reject", "replace", "keep"] = Field(
        "reject", description="another content under a stored SOP Instance UID (STOW-RS, C-STORE, import): reject "
                              "(0x0111/409), replace (a new version, as an update) or keep (success, the stored one kept)")
    bulk_threshold: int = Field(1024, ge=0, le=2**32 - 2, description="binary values longer than this (bytes) become "
                                                        "BulkDataURIs")
    render_cache_bytes: int = Field(64 * 1024**2, ge=0, le=64 * 1024**3, description="rendered-picture cache per worker (0: off)")
    transcode_cache_bytes: int = Field(64 * 1024**2, ge=0, le=64 * 1024**3, description="cache of frames transcoded to "
                                       "a compressed syntax per worker (0: off)")
    decode_processes: int = Field(2, ge=1, le=64, description="isolated decoder processes per worker for compressed "
                                                       "frames")
    decode_timeout: float = Field(60.0, gt=0, le=3600, description="seconds one compressed frame may take to decode "
                                                          "(then 406)")
    shutdown_timeout: float = Field(30.0, gt=0, le=3600, description="seconds a stopping worker (or DIMSE listener) lets "
                                                            "requests and associations in flight finish")
    access_log: bool = Field(False, description="uvicorn access log (halves small-answer throughput)")
    log_level: str = Field("info", description="log level: `critical`, `error`, `warning`, `info`, `debug`, "
                                               "`trace`")
    cors_origins: list[str] = Field(default_factory=list, description="allowed browser origins (CORS); "
                                                                      "`[\"*\"]` for any; none: CORS off")
    api_keys: dict[str, list[str]] = Field(default_factory=dict, description='bearer API keys inline: '
                                           '`{"token": ["read", "write", "delete"]}`')
    api_keys_file: Path | None = Field(None, description='JSON file of API keys and their scopes: '
                                       '`{"token": ["read", "write", "delete"]}`')
    basic_users_file: Path | None = Field(None, description='HTTP basic users: JSON '
                                          '`{"user": {"password_sha256": "...", "scopes": [...]}}`')
    access_rules: dict = Field(default_factory=dict, description='who sees which studies, inline (access/rules.py): '
                               '`{"identities": {"basic:alice": ["cardio"], "ae:CT1": ["radio"]}, '
                               '"claim": "groups", "default": "*"}`; none: everyone sees every study')
    access_rules_file: Path | None = Field(None, description="JSON file of access rules (the form of "
                                                             "`access_rules`, which overrides its keys)")
    oidc_issuer: str | None = Field(None, description="OAuth2/OIDC access tokens (JWT): the expected issuer "
                                                      "(`iss`)")
    oidc_audience: str | None = Field(None, description="OAuth2/OIDC: the expected audience (`aud`)")
    oidc_jwks_url: str | None = Field(None, description="OAuth2/OIDC: the issuer's JWKS URL; tokens are checked "
                                                        "against its keys")
    oidc_jwks_timeout: float = Field(5.0, gt=0, le=300, description="seconds one JWKS fetch may take (then the old keys "
                                                            "are kept)")
    oidc_jwks_cache_seconds: float = Field(300.0, ge=0, le=7 * 86400, description="seconds the JWKS keys are kept")
    oidc_client_id: str | None = Field(None, description="OIDC login of the archive's web pages (the viewer at "
                                       "`/viewer/`, the operator's page at `/ui/`): the client id of a public client "
                                       "registered at `oidc_issuer` (authorization code + PKCE); none: no login "
                                       "there (docs/notes/oidc.md)")
    oidc_scope: str = Field("openid dicomweb:read dicomweb:write dicomweb:delete",
                            description="OIDC login of the web pages: the scopes they ask for (space separated; "
                                        "the archive reads `read`, `write`, `delete` with or without a "
                                        "`dicomweb:` prefix from the access token)")
    share_max_seconds: int = Field(30 * 86400, ge=1, le=10 * 366 * 86400,
                                   description="the longest a share link (`POST /studies/{study}/share`) may "
                                               "live, in seconds (`expires_in` above it: 400; the default "
                                               "`expires_in`, 7 days, is capped by it)")
    audit_log: Path | None = Field(None, description="append one JSON line per DICOMweb request (and DIMSE "
                                                     "association) to this file")
    insecure: bool = Field(False, description="allow a non-loopback `host` without authentication")
    routes_file: Path | None = Field(None, description="TOML routes file: forward stored instances (Routing)")
    keep_rejected: float = Field(30.0, ge=0, le=36500, description="days the files of rejected instances (IOCM "
                                 "rejection notes, `POST .../reject/{code}^{scheme}`) are kept, restorable, before "
                                 "they are purged (lifecycle/reject.py)")
    retention_file: Path | None = Field(None, description="TOML retention policy: rules that delete or reject old "
                                        "studies, quota watermarks and a hard limit (policy/retention.py)")
    retention_interval: float = Field(0.0, ge=0, le=30 * 86400, description="seconds between two retention runs "
                                      "in the server (each worker, one at a time per node); 0: off (run "
                                      "`dicomweb-server retention` instead)")
    # the OHIF web viewer at /viewer (dicomweb_server/viewer.py)
    viewer: bool = Field(False, description="serve the OHIF viewer at `/viewer/`")
    viewer_dir: Path | None = Field(None, description="the OHIF `dist/` folder (holding `index.html`); default: "
                                                      "fetched with npm into "
                                                      "`~/.cache/dicomweb-archive/ohif-app-VERSION/dist`")
    # the DIMSE front door (dicomweb_server/dimse/): C-ECHO, C-STORE, C-FIND, C-GET, C-MOVE
    dimse_port: int = Field(11112, ge=0, le=65535, description="DIMSE listener port; 0 turns plain DIMSE off (and "
                                                               "DIMSE altogether without `dimse_tls_port`)")
    dimse_tls_port: int = Field(0, ge=0, le=65535, description="DICOM TLS listener port (PS3.15 Annex B), served "
                                "beside `dimse_port` by the same listener processes and association slots; "
                                "0 = off; needs `dimse_tls_cert_file` and `dimse_tls_key_file`")
    dimse_tls_cert_file: Path | None = Field(None, description="PEM certificate (chain) of the TLS listener")
    dimse_tls_key_file: Path | None = Field(None, description="PEM private key of the TLS listener (unencrypted)")
    dimse_tls_ca_file: Path | None = Field(None, description="PEM CA certificate(s) that client certificates of "
                                                             "the TLS listener are checked against")
    dimse_tls_require_client_cert: bool = Field(False, description="the TLS listener refuses a client without a "
                                                                   "certificate signed by `dimse_tls_ca_file`")
    ae_title: str = Field("DICOMWEB", description="this archive's AE title")
    dimse_peers_file: Path | None = Field(None, description="JSON/TOML of AE title -> {host, port, scopes}: "
                                                            "the C-MOVE destinations; with authentication, "
                                                            "the only peers DIMSE serves")
    dimse_allowed_aes: list[str] = Field(default_factory=list, description="calling AE titles accepted; none: any")
    dimse_check_called_ae: bool = Field(False, description="reject associations whose called AE title is not "
                                                           "`ae_title`")
    dimse_max_associations: int = Field(
        64, ge=1, le=1000, description="concurrent associations of the node, all listener processes together "
                                       "(A-ASSOCIATE-RJ beyond it); twice as many TCP connections (the rest closed "
                                       "at accept)")
    dimse_max_associations_per_peer: int | None = Field(
        None, ge=1, le=1000, description="concurrent associations of one peer address, and of one calling AE title "
                                         "(twice as many connections per address); default: a quarter of "
                                         "`dimse_max_associations`")
    dimse_processes: int = Field(0, ge=0, le=64, description="DIMSE listener processes sharing the port (SO_REUSEPORT); "
                                 "0 = two per core, at least 2, at most 8 (the in-memory index: inside its one worker)")
    dimse_acse_timeout: float = Field(
        10.0, gt=0, le=3600, description="association negotiation timeout (s): a connection without its "
                                         "A-ASSOCIATE-RQ by then is closed")
    dimse_timeout: float = Field(60.0, gt=0, le=86400, description="DIMSE message timeout (s)")
    dimse_network_timeout: float = Field(60.0, gt=0, le=86400, description="idle connection timeout (s)")
    dimse_max_pdu: int = Field(4 * 1024**2, ge=0, le=2**32 - 1, description="largest PDU received (bytes; announced as the "
                               "Maximum Length; a PDU whose header declares more than max(this, 1 MiB) closes the "
                               "connection when read, A-ASSOCIATE-RQ included; 0 = unlimited)")
    dimse_commitment_retry: float = Field(10.0, gt=0, le=86400, description="storage commitment: seconds before a "
                                          "report the requester did not take is sent again (doubled each "
                                          "attempt, at most 60 times this)")
    dimse_commitment_max_attempts: int = Field(20, ge=1, le=10000, description="storage commitment: attempts to "
                                               "send a report before it is a dead letter of the outbox")
    dimse_character_set: str = Field("ISO_IR 100", description="Specific Character Set (0008,0005) of non-ASCII "
                                     "text the archive sends over DIMSE (C-FIND answers, the pull's C-FIND) when "
                                     "neither the SCU's requested one nor the data's own holds every value: used "
                                     "when it does, else ISO_IR 192 (UTF-8); code extensions separated by "
                                     "backslashes (`\\ISO 2022 IR 87`); empty: straight to UTF-8")
    hl7_port: int = Field(0, ge=0, le=65535, description="MLLP port of HL7 v2 ORM^O01 orders into the modality "
                          "worklist, served by the DIMSE listener (0 = off)")
    hl7_max_message: int = Field(1024 * 1024, ge=1024, le=64 * 1024 * 1024, description="the longest HL7 message "
                                 "the MLLP port reads, in bytes (a longer one closes the connection)")
    dimse_in_worker: bool = Field(False, description="internal: run the listener inside the HTTP worker")
    jobs_concurrency: int = Field(2, ge=1, le=64, description="background jobs (de-identify, recompress, pull): "
                                  "how many of one kind run at once across the archive's processes and nodes")
    jobs_lease: float = Field(120.0, ge=10, le=86400, description="background jobs: seconds a job's runner holds "
                              "it without renewing (renewed every third); a runner that died is replaced after "
                              "this (at once on the same host)")
    jobs_retry: float = Field(30.0, gt=0, le=86400, description="background jobs: seconds before a job that raised "
                              "runs again from its checkpoint (doubled each attempt, at most an hour)")
    jobs_max_attempts: int = Field(5, ge=1, le=1000, description="background jobs: attempts before a job that keeps "
                                   "raising is failed (a dead letter of the outbox)")

    @model_validator(mode="after")
    def _database(self) -> "Settings":
        if self.index == "postgresql" and not self.database_url:
            raise ValueError("--index postgresql needs --database-url (DICOMWEB_DATABASE_URL)")
        if self.dimse_tls_port and not (self.dimse_tls_cert_file and self.dimse_tls_key_file):
            raise ValueError("--dimse-tls-port needs --dimse-tls-cert-file and --dimse-tls-key-file "
                             "(DICOMWEB_DIMSE_TLS_CERT_FILE, DICOMWEB_DIMSE_TLS_KEY_FILE)")
        if self.oidc_client_id and not (self.oidc_issuer and self.oidc_jwks_url):
            raise ValueError("--oidc-client-id needs --oidc-issuer and --oidc-jwks-url (DICOMWEB_OIDC_ISSUER, "
                             "DICOMWEB_OIDC_JWKS_URL): the pages log in at the issuer, the archive checks "
                             "the tokens with its keys")
        if self.dimse_tls_require_client_cert and not self.dimse_tls_ca_file:
            raise ValueError("--dimse-tls-require-client-cert needs --dimse-tls-ca-file (DICOMWEB_DIMSE_TLS_CA_FILE): "
                             "the CA client certificates are checked against")
        return self

    @field_validator("host")
    @classmethod
    def _host(cls, v: str) -> str:
        if problem := host_problem(v):
            raise ValueError(problem)
        return v

    @field_validator("ae_title")
    @classmethod
    def _ae_title(cls, v: str) -> str:
        if problem := ae_title_problem(v):
            raise ValueError(problem)
        return v

    @field_validator("dimse_allowed_aes")
    @classmethod
    def _allowed_aes(cls, v: list[str]) -> list[str]:
        for title in v:
            if problem := ae_title_problem(title):
                raise ValueError(problem)
        return v

    @field_validator("dimse_character_set")
    @classmethod
    def _character_set(cls, v: str) -> str:
        """PS3.3 C.12.1.1.2 Defined Terms pydicom can encode (dicom/charset.py)."""
        if v.strip() and configured(v) is None:
            raise ValueError(f"{v!r} is not a Specific Character Set this archive can encode (e.g. ISO_IR 100, "
                             "ISO_IR 192, \\ISO 2022 IR 87)")
        return v.strip()

    @field_validator("dimse_max_pdu")
    @classmethod
    def _max_pdu(cls, v: int) -> int:
        """PS3.8 §D.1: the Maximum Length Received is 32 bits, 0 meaning no limit; below
        4096 bytes (DCMTK's smallest) a peer would send a data set in tiny fragments."""
        if problem := MAX_PDU.problem(v):
            raise ValueError(problem)
        return v

    @field_validator("s3_endpoint_url")
    @classmethod
    def _endpoint(cls, v: str | None) -> str | None:
        """http(s)://host[:port][/path] (botocore raised a bare ValueError deep in start-up
        for anything else, or took a host-less URL for AWS)."""
        if v is None or not v.strip():
            return None
        from urllib.parse import urlsplit

        v = v.strip()
        try:
            parts = urlsplit(v)
            parts.port  # noqa: B018 - raises ValueError for a port that is not a number
        except ValueError as e:
            raise ValueError(f"S3 endpoint {v!r}: {e}") from None
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
            raise ValueError(f"S3 endpoint {v!r}: expected http(s)://host[:port], e.g. http://minio:9000")
        return v

    @field_validator("storage")
    @classmethod
    def _storage(cls, v: str | None) -> str | None:
        if v is None or not v.strip():
            return None
        from .store.s3 import parse_storage_url  # raises ValueError for anything else

        parse_storage_url(v.strip())
        return v.strip()

    @field_validator("prefix")
    @classmethod
    def _prefix(cls, v: str) -> str:
        v = v.strip().rstrip("/")
        if v and not v.startswith("/"):
            v = "/" + v
        return v

    def dimse_on(self) -> bool:
        """A DIMSE listener runs: the plain port, the TLS port (PS3.15 Annex B), or both."""
        return bool(self.dimse_port or self.dimse_tls_port)

    def auth_configured(self) -> bool:
        return bool(self.api_keys or self.api_keys_file or self.basic_users_file or self.oidc_jwks_url)

    def effective_workers(self) -> int:
        """Worker processes to start: the in-memory index lives in one process."""
        if self.index == "memory":
            return 1
        return self.workers or (os.cpu_count() or 1)


def field_bound(name: str) -> Bound | None:
    """The range of the numeric setting ``name`` (from its ``Field`` constraints), or None."""
    info = Settings.model_fields.get(name)
    if name == "dimse_max_pdu":
        return MAX_PDU
    if info is None:
        return None
    lo = hi = None
    lo_open = False
    for c in info.metadata:
        if getattr(c, "ge", None) is not None:
            lo = c.ge
        elif getattr(c, "gt", None) is not None:
            lo, lo_open = c.gt, True
        elif getattr(c, "le", None) is not None:
            hi = c.le
    if lo is None or hi is None:
        return None
    integer = info.annotation in (int, int | None)
    return Bound(lo, hi, integer=integer, lo_open=lo_open)


def error_lines(e: ValidationError) -> list[str]:
    """One line per refused setting: its name, its environment variable, what was given
    and what is allowed (``dicomweb-server`` prints them and exits 2)."""
    lines = []
    for err in e.errors():
        loc = err.get("loc", ())
        name = str(loc[0]) if loc else ""
        where = ".".join(str(x) for x in loc) or "settings"
        if name in Settings.model_fields:
            where += f" (DICOMWEB_{name.upper()})"
        msg = err.get("msg", "").removeprefix("Value error, ")
        bound = field_bound(name) if len(loc) == 1 else None
        if bound is not None and "allowed:" not in msg:
            given = err.get("input")
            if err.get("type") in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
                msg = f"{given} is out of range"
            else:
                msg = f"{given!r}: {msg[:1].lower() + msg[1:]}"
            msg += f"; allowed: {bound.describe()}"
        lines.append(f"{where}: {msg}")
    return lines


#: settings whose value an error line does not repeat: it would leave tokens in logs and journals
_SECRETS = frozenset({"api_keys"})

#: what a mapping setting looks like as JSON in the environment (docs/configuration.md)
_JSON_EXAMPLES = {
    "api_keys": '{"my-secret-token": ["read", "write", "delete"]}',
    "access_rules": '{"identities": {"basic:alice": ["cardio"]}, "default": "*"}',
}


def settings_error_line(e: SettingsError) -> str:
    """One line for a list or mapping setting whose environment variable is not JSON.

    pydantic-settings decodes such variables (``DICOMWEB_CORS_ORIGINS``, ``DICOMWEB_API_KEYS``,
    ``DICOMWEB_ACCESS_RULES``, ``DICOMWEB_DIMSE_ALLOWED_AES``) with ``json.loads`` before any
    validation, and raises :class:`SettingsError` with a traceback a user cannot act on. The
    line names the setting, its variable, what was given and the JSON wanted: for a list, the
    value given, split at commas, as a JSON list."""
    m = re.search(r'field "(\w+)"', str(e))
    name = m.group(1) if m else ""
    var = f"DICOMWEB_{name.upper()}"
    # pydantic-settings reads the environment case-insensitively
    given = next((v for k, v in os.environ.items() if k.upper() == var), None)
    info = Settings.model_fields.get(name)
    if info is None or given is None:
        return f"settings: {e}"
    why = f" ({e.__cause__})" if isinstance(e.__cause__, json.JSONDecodeError) else ""
    if typing.get_origin(info.annotation) is list:
        items = [x.strip() for x in given.split(",") if x.strip()] or ["..."]
        example = json.dumps(items)
        wanted = "a JSON list"
    else:
        example = _JSON_EXAMPLES.get(name, "{...}")
        wanted = "a JSON object"
    shown = "the value given (not shown: it holds secrets)" if name in _SECRETS else repr(given)
    return f"{name} ({var}): {shown} is not JSON{why}; give {wanted}, e.g. {var}='{example}'"
