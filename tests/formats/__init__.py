"""Tests of the pure byte formats against real RocketMQ fixtures."""
