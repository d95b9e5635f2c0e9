"""The archive as Apache Iceberg tables, one per topic: open the catalog, keep each table in sync, read its offsets,
and keep it compact and bounded (``maintenance``).

``tieredstore table sync`` and the archiver (``[table] enabled``) call ``sync_topic``; a table's snapshots
carry every queue's table offset (``offsets``), so a sync continues exactly where the table ends.
pyiceberg is imported here, so this package needs ``pip install 'tieredstore[table]'``.
"""
