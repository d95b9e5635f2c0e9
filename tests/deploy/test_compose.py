"""compose.yaml wires the archiver to the MinIO and PostgreSQL services it defines (parsed: no Docker here)."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from tieredstore.config import load_config

REPO = Path(__file__).resolve().parents[2]


def _compose() -> dict[str, Any]:
    loaded = yaml.safe_load((REPO / "compose.yaml").read_text())
    assert isinstance(loaded, dict)
    return loaded


def test_archiver_points_at_the_services_compose_defines(monkeypatch: Any) -> None:
    compose = _compose()
    services = compose["services"]
    archiver = services["archiver"]
    env = archiver["environment"]
    # The archiver's own config loader accepts exactly this environment.
    for name, value in env.items():
        monkeypatch.setenv(name, str(value))
    config = load_config()

    endpoint = urlsplit(config.s3.endpoint_url or "")
    assert endpoint.hostname in services and endpoint.hostname == "minio"
    container_ports = {mapping.split(":")[-1] for mapping in services["minio"]["ports"]}
    assert str(endpoint.port) in container_ports, "the S3 endpoint port is the one MinIO serves on"

    bucket = urlsplit(config.effective_cold_url).netloc
    init_command = services["minio-init"]["entrypoint"]
    assert f"local/{bucket}" in init_command, "the bucket the archiver writes is the one minio-init creates"

    database = urlsplit(config.effective_metadata_url)
    assert database.scheme == "postgresql+psycopg"
    assert database.hostname in services and database.hostname == "postgres"
    pg_env = services["postgres"]["environment"]
    assert database.username == pg_env["POSTGRES_USER"]
    assert database.password == pg_env["POSTGRES_PASSWORD"]
    assert database.path.lstrip("/") == pg_env["POSTGRES_DB"]

    # One archiver service, so no queue leases: it writes the key index that query-key reads.
    assert config.archiver.leases is False

    minio_env = services["minio"]["environment"]
    assert config.s3.access_key_id is not None and config.s3.secret_access_key is not None
    assert config.s3.access_key_id.get_secret_value() == minio_env["MINIO_ROOT_USER"]
    assert config.s3.secret_access_key.get_secret_value() == minio_env["MINIO_ROOT_PASSWORD"]


def test_services_have_health_checks_and_the_hot_store_a_volume() -> None:
    compose = _compose()
    services = compose["services"]
    for name in ("minio", "postgres", "archiver"):
        assert "healthcheck" in services[name], f"{name} has no health check"
    archiver = services["archiver"]
    assert archiver["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert archiver["depends_on"]["minio-init"]["condition"] == "service_completed_successfully"
    hot_mounts = [m for m in archiver["volumes"] if m.split(":")[1] == archiver["environment"]["TIEREDSTORE_DATA_DIR"]]
    assert hot_mounts and hot_mounts[0].split(":")[0] in compose["volumes"]
    assert (REPO / archiver["build"] / "Dockerfile").exists()
