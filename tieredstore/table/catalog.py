"""Opening the Iceberg catalog and naming each topic's table and where its files go.

By default the catalog is pyiceberg's SQL catalog in the metadata database (SQLite or PostgreSQL through
the same SQLAlchemy URL), so a deployment needs nothing new; ``[table] catalog_uri`` names an Iceberg REST
catalog instead. Tables live under the cold URL, in ``TABLES_FOLDER``, on the same storage as the archive:
the cold layout's top-level folders are all ``<md5 prefix>_<cluster>``, so no listing of the archive takes
this one for a cluster, topic or queue.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from sqlalchemy.exc import SQLAlchemyError

from tieredstore.config import TieredStoreConfig
from tieredstore.errors import ConfigError, MetadataUnavailableError, MissingExtraError
from tieredstore.metadata.engine import safe_url
from tieredstore.providers.posix import root_from_url
from tieredstore.providers.registry import redact_url, url_scheme

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog

TABLES_FOLDER = "iceberg"
CATALOG_NAME = "tieredstore"


def require_pyiceberg() -> None:
    """MissingExtraError naming the extra to install unless pyiceberg (with its core transforms) is."""
    try:
        import pyiceberg  # noqa: F401
        import pyiceberg_core  # noqa: F401  (day partitioning of Arrow rows needs its transforms)
    except ImportError as error:
        raise MissingExtraError("Iceberg tables need pyiceberg: pip install 'tieredstore[table]'") from error


def tables_root(config: TieredStoreConfig) -> str:
    """The URL of the folder under the cold URL that holds every table (file:// or s3://)."""
    cold_url = config.effective_cold_url
    scheme = url_scheme(cold_url)
    if scheme == "file":
        return f"file://{root_from_url(cold_url)}/{TABLES_FOLDER}"
    if scheme == "s3":
        return f"{cold_url.rstrip('/')}/{TABLES_FOLDER}"
    raise ConfigError(f"Iceberg tables are kept on POSIX or S3 cold storage, not {redact_url(cold_url)} ({scheme}://)")


def relative_path(path: str, folder: str) -> str | None:
    """``path`` relative to ``folder`` (None when not under it), whichever way each spells a local path
    (file:// or not): pyiceberg, catalogs and our settings do not agree."""
    path, folder = path.removeprefix("file://"), folder.removeprefix("file://").rstrip("/")
    return path[len(folder) + 1 :] if path.startswith(folder + "/") else None


def cold_key(config: TieredStoreConfig, url: str) -> str | None:
    """The path under the cold URL (as our providers name it) of ``url``, a table's folder or file; None when
    ``url`` lies outside the cold URL or is the cold URL itself."""
    key = relative_path(url, tables_root(config).removesuffix(f"/{TABLES_FOLDER}"))
    if key is None:
        return None
    return key.rstrip("/") or None


def table_path(config: TieredStoreConfig, topic: str) -> str:
    """The logical path (under the cold URL, as our providers name it) of ``topic``'s table folder."""
    return f"{TABLES_FOLDER}/{config.table.namespace}/{topic}"


def table_location(config: TieredStoreConfig, topic: str) -> str:
    """Where ``topic``'s table keeps its data and metadata files."""
    return f"{tables_root(config)}/{config.table.namespace}/{topic}"


def file_io_properties(config: TieredStoreConfig) -> dict[str, str]:
    """pyiceberg FileIO properties for the cold tier: our ``[s3]`` endpoint, credentials, region and style."""
    if url_scheme(config.effective_cold_url) != "s3":
        return {}
    return s3_file_io_properties(config.s3_options())


def s3_file_io_properties(s3: Mapping[str, Any]) -> dict[str, str]:
    """pyiceberg FileIO properties of our S3 options (``[s3]``, or a Spark read's S3 options)."""
    names = {
        "endpoint_url": "s3.endpoint",
        "region": "s3.region",
        "access_key_id": "s3.access-key-id",
        "secret_access_key": "s3.secret-access-key",
        "session_token": "s3.session-token",
    }
    properties = {iceberg: str(s3[ours]) for ours, iceberg in names.items() if s3.get(ours) is not None}
    # Path-style requests unless virtual hosts are asked for: what S3-compatible endpoints (MinIO, moto) need.
    properties["s3.force-virtual-addressing"] = "true" if s3.get("addressing_style") == "virtual" else "false"
    if s3.get("sse") == "AES256":
        properties["s3.server-side-encryption"] = "AES256"
    return properties


def first_line(error: BaseException) -> str:
    """The first line of what ``error`` says (its type when it says nothing): one line for a ConfigError or a log."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


@contextmanager
def catalog_errors(topic: str) -> Iterator[None]:
    """The catalog failing mid-sync as one line: refused credentials as ConfigError; the SQL catalog's database
    down or locked, or a REST catalog's server error, as MetadataUnavailableError."""
    from pyiceberg.exceptions import RESTError, ServerError

    try:
        yield
    except ConfigError:
        raise
    except Exception as error:
        if _refused_credentials(error):
            raise ConfigError(
                f"table {topic}: the Iceberg catalog refused our credentials ([table] catalog_token or "
                f"catalog_credential): {first_line(error)}"
            ) from error
        if isinstance(error, (SQLAlchemyError, RESTError, ServerError)):
            raise MetadataUnavailableError(f"table {topic}: the Iceberg catalog failed: {first_line(error)}") from error
        raise


def open_catalog(config: TieredStoreConfig, *, create_tables: bool = True) -> Catalog:
    """The catalog of ``config``: REST when ``[table] catalog_uri`` names one, else SQL in the metadata database.

    The SQL catalog's two tables are created in the metadata database on first use, unless ``create_tables``
    is False (a read-only look such as ``tieredstore status``).
    """
    return open_catalog_at(
        config.effective_metadata_url,
        config.table.catalog_uri,
        file_io_properties(config),
        create_tables=create_tables,
        rest_properties=config.table.rest_properties(),
    )


def open_catalog_at(
    metadata_url: str | None,
    catalog_uri: str | None,
    io_properties: Mapping[str, str],
    *,
    create_tables: bool,
    rest_properties: Mapping[str, str] | None = None,
) -> Catalog:
    """The REST catalog at ``catalog_uri`` if given (with ``rest_properties``: warehouse, prefix, credentials),
    else the SQL catalog in ``metadata_url``, their files reached with ``io_properties``; what ``open_catalog``
    opens, from parts a Spark read's options also give."""
    require_pyiceberg()
    from pyiceberg.catalog.rest import RestCatalog
    from pyiceberg.catalog.sql import SqlCatalog

    properties: dict[str, Any] = dict(io_properties)
    uri = catalog_uri
    try:
        if uri is not None:
            if url_scheme(uri) not in ("http", "https"):
                raise ConfigError(f"[table] catalog_uri must be an Iceberg REST catalog (http(s)://), not {uri!r}")
            return RestCatalog(CATALOG_NAME, uri=uri, **properties, **(rest_properties or {}))
        if metadata_url is None:
            raise ConfigError("an Iceberg catalog needs a metadata database (its SQL catalog) or a REST catalog_uri")
        properties["init_catalog_tables"] = "true" if create_tables else "false"
        return SqlCatalog(CATALOG_NAME, uri=metadata_url, **properties)
    except ConfigError:
        raise
    except Exception as error:  # pyiceberg and SQLAlchemy raise many kinds; one line says where
        where = redact_url(uri) if uri is not None else safe_url(str(metadata_url))
        if _refused_credentials(error):
            raise ConfigError(
                f"the Iceberg catalog in {where} refused our credentials ([table] catalog_token or "
                f"catalog_credential): {first_line(error)}"
            ) from error
        raise MetadataUnavailableError(f"cannot open the Iceberg catalog in {where}: {first_line(error)}") from error


def _refused_credentials(error: Exception) -> bool:
    """Whether a REST catalog answered 401/403 or its OAuth2 exchange failed: settings to fix, not an outage."""
    from pyiceberg.exceptions import ForbiddenError, OAuthError, UnauthorizedError

    return isinstance(error, (ForbiddenError, OAuthError, UnauthorizedError))


@contextmanager
def refusals_explained(config: TieredStoreConfig, topic: str) -> Iterator[None]:
    """A REST catalog refusing to create ``topic``'s namespace or table (a location it assigns itself, a
    namespace it does not allow) as ConfigError, one line: settings to change, not an outage to wait out."""
    from pyiceberg.exceptions import RESTError, ServerError, ServiceUnavailableError, TooManyRequestsError

    try:
        yield
    except RESTError as error:
        if isinstance(error, (ServerError, ServiceUnavailableError, TooManyRequestsError)) or _refused_credentials(
            error
        ):
            raise
        hint = ""
        if config.table.location == "cold":
            hint = '; if the catalog assigns table locations itself, set [table] location = "catalog"'
        raise ConfigError(
            f"table {topic}: the Iceberg catalog refused to create it in namespace {config.table.namespace!r}: "
            f"{first_line(error)}{hint}"
        ) from error
