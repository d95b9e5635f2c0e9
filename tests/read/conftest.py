"""Read-path tests: backends restricted to the three providers the read path is specified against."""

from __future__ import annotations

import pytest

READ_BACKENDS = ["memory", "posix", "s3"]

# Use as ``@over_backends`` on a test taking ``provider_factory``: memory, posix and s3 (moto over HTTP).
over_backends = pytest.mark.parametrize("provider_factory", READ_BACKENDS, indirect=True)
