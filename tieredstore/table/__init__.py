"""The archive as an Apache Iceberg table per topic: catalog, sync and maintenance."""
