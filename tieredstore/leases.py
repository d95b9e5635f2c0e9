"""Queue leases where they were first imported from; the code is in ``tieredstore.archiver.leases``."""

from tieredstore.archiver.leases import (
    SAFETY_MARGIN_FRACTION,
    LeaseChanges,
    LeaseManager,
    SingleArchiverLock,
    default_owner_id,
)

__all__ = ["SAFETY_MARGIN_FRACTION", "LeaseChanges", "LeaseManager", "SingleArchiverLock", "default_owner_id"]
