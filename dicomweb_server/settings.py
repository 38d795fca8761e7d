"""Archive configuration: one pydantic-settings model; every field is also an
environment variable with the prefix ``DICOMWEB_`` (e.g. ``DICOMWEB_DATA_DIR``),
and the ``dicomweb-server`` command line maps its flags onto the same fields."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Configuration of one archive process.

    Units: sizes in bytes, times in seconds.
    """

    model_config = SettingsConfigDict(env_prefix="DICOMWEB_", extra="ignore")

    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    data_dir: Path = Path("./data")
    index: Literal["sqlite", "memory", "postgresql"] = "sqlite"
    database_url: str | None = Field(
        None, description="PostgreSQL index: postgresql://user@host:port/db (libpq URL; env DICOMWEB_DATABASE_URL)")
    database_pool_size: int = Field(
        8, ge=1, description="PostgreSQL: read connections per worker process (as many again for placement locks)")
    storage: str | None = Field(
        None, description="where instances are kept: s3://bucket/prefix (S3-compatible object storage); "
                          "default: the data folder's blobs/ (env DICOMWEB_STORAGE)")
    s3_endpoint_url: str | None = Field(
        None, description="S3 endpoint, e.g. http://minio:9000 (MinIO, Ceph RGW); default: AWS "
                          "(env DICOMWEB_S3_ENDPOINT_URL; credentials and region: the AWS_* variables)")
    workers: int | None = Field(None, ge=1, description="default: one per core with sqlite, 1 with memory")
    prefix: str = Field("", description="path prefix DICOMweb is served under, e.g. /dicomweb")
    public_url: str | None = Field(
        None, description="base URL written into RetrieveURL/BulkDataURI; default: from the request"
    )
    max_request_bytes: int = Field(4 * 1024**3, ge=1, description="STOW-RS body cap -> 413")
    max_parts: int = Field(10_000, ge=1, description="STOW-RS parts per request cap -> 413")
    body_timeout: float = Field(60.0, gt=0, description="seconds a STOW-RS body may stall -> 408")
    body_min_rate: int = Field(
        10240, ge=1, description="STOW-RS total deadline: body_timeout + bytes received / this rate (B/s) -> 408")
    header_timeout: float = Field(10.0, gt=0, description="seconds to receive request line + headers -> 408, close")
    max_header_bytes: int = Field(65536, ge=1024, description="request line + headers cap -> 414/431, close")
    max_results: int = Field(1000, ge=1, description="QIDO-RS maximum (and default) limit")
    bulk_threshold: int = Field(1024, ge=0, description="binary values larger than this become BulkDataURIs")
    render_cache_bytes: int = Field(64 * 1024**2, ge=0, description="rendered-image cache cap per worker")
    decode_processes: int = Field(2, ge=1, description="isolated decoder processes per worker (compressed pixels)")
    decode_timeout: float = Field(60.0, gt=0, description="seconds one compressed frame may take to decode")
    shutdown_timeout: float = Field(30.0, gt=0, description="seconds a stopping worker lets requests in flight finish")
    access_log: bool = False
    log_level: str = "info"
    cors_origins: list[str] = Field(default_factory=list, description="CORS allowed origins; ['*'] for any")
    api_keys: dict[str, list[str]] = Field(default_factory=dict, description='{"token": ["read", "write"]}')
    api_keys_file: Path | None = Field(None, description="JSON file of API keys and their scopes")
    basic_users_file: Path | None = Field(None, description='JSON {"user": {"password_sha256": .., "scopes": [..]}}')
    oidc_issuer: str | None = None
    oidc_audience: str | None = None
    oidc_jwks_url: str | None = None
    oidc_jwks_timeout: float = Field(5.0, gt=0, description="seconds one JWKS fetch may take (then: old keys kept)")
    oidc_jwks_cache_seconds: float = Field(300.0, ge=0, description="seconds the JWKS keys are kept")
    audit_log: Path | None = Field(None, description="append one JSON line per DICOMweb request here")
    insecure: bool = Field(False, description="allow listening beyond loopback without authentication")
    routes_file: Path | None = Field(None, description="TOML routes file: forward stored instances (routing/)")
    # the OHIF web viewer at /viewer (dicomweb_server/viewer.py)
    viewer: bool = Field(False, description="serve the OHIF viewer at /viewer")
    viewer_dir: Path | None = Field(None, description="OHIF dist/ folder; default: fetched with npm into ~/.cache")
    # the DIMSE front door (dicomweb_server/dimse/): C-ECHO, C-STORE, C-FIND, C-GET, C-MOVE
    dimse_port: int = Field(11112, ge=0, le=65535, description="DIMSE listener port; 0 turns it off")
    ae_title: str = Field("DICOMWEB", min_length=1, max_length=16, description="this archive's AE title")
    dimse_peers_file: Path | None = Field(None, description="JSON/TOML of AE title -> {host, port} (C-MOVE)")
    dimse_allowed_aes: list[str] = Field(default_factory=list, description="calling AE titles accepted; [] = any")
    dimse_check_called_ae: bool = Field(False, description="reject associations not addressed to ae_title")
    dimse_max_associations: int = Field(
        64, ge=1, description="concurrent associations of the node, all listener processes together; twice as many "
                              "TCP connections (the rest closed at accept)")
    dimse_max_associations_per_peer: int | None = Field(
        None, ge=1, description="concurrent associations of one peer address, and of one calling AE title "
                                "(twice as many connections per address); default: a quarter of "
                                "dimse_max_associations")
    dimse_processes: int = Field(0, ge=0, description="DIMSE listener processes sharing the port (SO_REUSEPORT); "
                                 "0 = one per core, at most 4 (the in-memory index: inside its one worker)")
    dimse_acse_timeout: float = Field(
        10.0, gt=0, description="association negotiation timeout (s): a connection without its A-ASSOCIATE-RQ "
                                "by then is closed")
    dimse_timeout: float = Field(60.0, gt=0, description="DIMSE message timeout (s)")
    dimse_network_timeout: float = Field(60.0, gt=0, description="idle connection timeout (s)")
    dimse_max_pdu: int = Field(4 * 1024**2, ge=0, description="maximum PDU received (bytes; 0 = unlimited)")
    dimse_in_worker: bool = Field(False, description="internal: run the listener inside the HTTP worker")

    @model_validator(mode="after")
    def _database(self) -> "Settings":
        if self.index == "postgresql" and not self.database_url:
            raise ValueError("--index postgresql needs --database-url (DICOMWEB_DATABASE_URL)")
        return self

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

    def auth_configured(self) -> bool:
        return bool(self.api_keys or self.api_keys_file or self.basic_users_file or self.oidc_jwks_url)

    def effective_workers(self) -> int:
        """Worker processes to start: the in-memory index lives in one process."""
        if self.index == "memory":
            return 1
        return self.workers or (os.cpu_count() or 1)
