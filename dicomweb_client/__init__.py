"""httpx client library for DICOMweb services (PS3.18): QIDO-RS, WADO-RS, STOW-RS.

Method names and parameters follow the PyPI ``dicomweb-client`` package, so
code written for it switches with a one-line change::

    # from dicomweb_client.api import DICOMwebClient   (PyPI dicomweb-client)
    from dicomweb_client import DICOMwebClient          (this package)

The two packages share the import name ``dicomweb_client`` and cannot be
installed in the same environment; this one is distributed as
``dicomweb-archive``.

Public names
------------
DICOMwebClient, AsyncDICOMwebClient
    Sync and async clients (same methods; async ones are awaited).
StoreResult, ReferencedSOP, FailedSOP
    Typed STOW-RS result.
DICOMwebError and subclasses
    See :mod:`dicomweb_client.errors`.
Part, iter_parts, aiter_parts, iter_part_streams, aiter_part_streams, stow_body
    Streaming multipart/related decoding and encoding.
"""
import logging

from .aio import AsyncDICOMwebClient
from .client import DICOMwebClient
from .errors import (
    BadRequest,
    ClientError,
    Conflict,
    DICOMwebError,
    Forbidden,
    Gone,
    HTTPError,
    MethodNotAllowed,
    NetworkError,
    NotAcceptable,
    NotFound,
    PayloadTooLarge,
    RequestTimeout,
    ResponseError,
    ServerError,
    ServiceUnavailable,
    StoreError,
    TooManyRequests,
    Unauthorized,
    UnsupportedMediaType,
)
from ._core import BearerAuth, RetryPolicy
from .multipart import (
    MultipartError,
    Part,
    aiter_part_streams,
    aiter_parts,
    iter_part_streams,
    iter_parts,
    parse_media_type,
)
from .stow import encode_multipart, stow_body
from .results import FAILURE_REASONS, FailedSOP, ReferencedSOP, StoreResult
from .urls import DICOMwebURLs

__version__ = "0.1.0"

# A library never prints: warnings go to this logger, silent until the
# application configures logging (Python logging HOWTO, "Configuring Logging for a Library").
logging.getLogger(__name__).addHandler(logging.NullHandler())

__all__ = [
    "DICOMwebClient",
    "AsyncDICOMwebClient",
    "BearerAuth",
    "RetryPolicy",
    "DICOMwebURLs",
    "StoreResult",
    "ReferencedSOP",
    "FailedSOP",
    "FAILURE_REASONS",
    "DICOMwebError",
    "HTTPError",
    "ClientError",
    "BadRequest",
    "Unauthorized",
    "Forbidden",
    "NotFound",
    "MethodNotAllowed",
    "NotAcceptable",
    "Conflict",
    "Gone",
    "PayloadTooLarge",
    "UnsupportedMediaType",
    "TooManyRequests",
    "ServerError",
    "ServiceUnavailable",
    "StoreError",
    "NetworkError",
    "RequestTimeout",
    "ResponseError",
    "MultipartError",
    "Part",
    "iter_parts",
    "aiter_parts",
    "iter_part_streams",
    "aiter_part_streams",
    "encode_multipart",
    "parse_media_type",
    "stow_body",
    "__version__",
]
