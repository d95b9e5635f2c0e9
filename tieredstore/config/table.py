"""Settings of the Apache Iceberg table kept per topic."""

from __future__ import annotations

from typing import ClassVar, Literal

import pydantic
from pydantic import Field, SecretStr

from tieredstore.basics import MIB
from tieredstore.config.section import Section


class TableSettings(Section):
    """The Apache Iceberg table per topic that ``tieredstore table sync`` and the archiver keep (docs/table.md)."""

    section: ClassVar[str] = "table"

    enabled: bool = Field(
        default=False,
        description="the archiver (tieredstore run) syncs every topic's table every commit_interval "
        "(pip install 'tieredstore[table]')",
    )
    commit_interval: float = Field(
        default=60.0, gt=0, description="seconds between the archiver's table syncs: the table's lag at most"
    )
    namespace: str = Field(
        default="tieredstore",
        min_length=1,
        pattern=r"^[A-Za-z0-9_]+$",
        description="the Iceberg namespace of the tables; each table is named after its topic",
    )
    catalog_uri: str | None = Field(
        default=None,
        description="an Iceberg REST catalog (http(s)://…); default: pyiceberg's SQL catalog in the metadata database",
    )
    catalog_properties: dict[str, str] = Field(
        default_factory=dict,
        description="further properties of the REST catalog, as pyiceberg names them (warehouse, prefix, scope, "
        "oauth2-server-uri, header.<name>); its credentials go in catalog_token or catalog_credential",
    )
    catalog_token: SecretStr | None = Field(
        default=None, description="a bearer token for the REST catalog (a secret: never printed)"
    )
    catalog_credential: SecretStr | None = Field(
        default=None,
        description="OAuth2 client credentials client_id:client_secret for the REST catalog (a secret: never printed)",
    )
    location: Literal["cold", "catalog"] = Field(
        default="cold",
        description="where a new table keeps its files: cold, under the cold URL (iceberg/<namespace>/<topic>); "
        "catalog, where the REST catalog assigns (for catalogs that refuse a location chosen by the client)",
    )
    target_file_size: int = Field(
        default=128 * MIB, ge=1 << 20, description="bytes of Arrow data each sync commit and data file aims at"
    )
    orphan_grace: float = Field(
        default=3600.0,
        ge=0,
        description="seconds an unreferenced data, manifest or metadata file under a table must be old before "
        "table sync deletes it (a file younger may belong to a sync about to commit)",
    )
    allow_unencrypted: bool = Field(
        default=False,
        description="sync even with [encryption] active_key set: the table's Parquet files are not encrypted",
    )
    snapshot_max_age: float = Field(
        default=86_400.0,
        ge=0,
        description="seconds a table snapshot is kept: each sync expires older ones (and files only they "
        "referenced), beyond the newest snapshot_retain_last",
    )
    snapshot_retain_last: int = Field(
        default=10, ge=1, description="newest snapshots each sync keeps whatever their age (time travel, readers)"
    )
    compact_interval: float = Field(
        default=3600.0,
        ge=0,
        description="seconds between the archiver's compactions of each table (small sync files merged); 0: never",
    )

    @pydantic.model_validator(mode="after")
    def _rest_settings_need_a_rest_catalog(self) -> TableSettings:
        given = [name for name in _REST_ONLY if getattr(self, name) not in (None, {}, "cold")]
        if given and self.catalog_uri is None:
            raise ValueError(f"{', '.join(given)} apply to a REST catalog: set catalog_uri too")
        return self

    def rest_properties(self) -> dict[str, str]:
        """The REST catalog's properties for pyiceberg, its credentials revealed only here, at the point of use."""
        properties = dict(self.catalog_properties)
        for name, secret in (("token", self.catalog_token), ("credential", self.catalog_credential)):
            if secret is not None:
                properties[name] = secret.get_secret_value()
        return properties


# Settings of [table] that mean nothing to the SQL catalog: given without catalog_uri they are a mistake.
_REST_ONLY = ("catalog_properties", "catalog_token", "catalog_credential", "location")
