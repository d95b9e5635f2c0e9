"""Several archivers on one metadata database: leases, fencing and the multi-process scenario."""
