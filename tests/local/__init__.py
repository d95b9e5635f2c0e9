"""Tests of the local hot store."""
