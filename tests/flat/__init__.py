"""Tests of the container layer: flat files, the flat-file store, recovery and the invariant checker."""
