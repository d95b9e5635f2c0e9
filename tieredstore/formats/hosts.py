"""The born and store hosts of a stored message: an IPv4 or IPv6 address and a port, as the record packs them."""

from __future__ import annotations

import functools
import ipaddress
import socket
import struct
from dataclasses import dataclass


@functools.lru_cache(maxsize=256)
def _encode_host(ip: str, port: int) -> bytes:
    # Parsing the address dominates a put's encoding cost, and a store writes with very few hosts.
    return ipaddress.ip_address(ip).packed + struct.pack(">i", port)


@dataclass(frozen=True, slots=True)
class HostAddress:
    """A host as the record stores it: an IPv4 or IPv6 address and a port."""

    ip: str
    port: int

    @property
    def is_ipv6(self) -> bool:
        return ":" in self.ip

    def encode(self) -> bytes:
        return _encode_host(self.ip, self.port)

    @classmethod
    def decode(cls, raw: bytes) -> HostAddress:
        return decode_host(bytes(raw))

    def __str__(self) -> str:
        return f"[{self.ip}]:{self.port}" if self.is_ipv6 else f"{self.ip}:{self.port}"


LOCALHOST = HostAddress("127.0.0.1", 0)


@functools.lru_cache(maxsize=1024)
def decode_host(raw: bytes) -> HostAddress:
    """The host packed in ``raw`` (8 bytes for IPv4, 20 for IPv6)."""
    # A commit log holds few distinct hosts, and building an ipaddress object per record dominated decoding.
    ip = socket.inet_ntoa(raw[:4]) if len(raw) == 8 else str(ipaddress.ip_address(raw[:-4]))
    return HostAddress(ip, struct.unpack(">i", raw[-4:])[0])
