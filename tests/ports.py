"""Port numbers for servers a test starts itself and that must keep their number (an engine
launched a minute later, a DNS server restarted on the same port): chosen below the
kernel's ephemeral range, which any outgoing connection on the machine may take meanwhile
(CI saw it happen: "Address already in use")."""

from __future__ import annotations

import random
import socket
from pathlib import Path

__all__ = ["quiet_ports"]


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(port: int, udp: bool) -> bool:
    kinds = [socket.SOCK_STREAM, socket.SOCK_DGRAM] if udp else [socket.SOCK_STREAM]
    socks = [socket.socket(socket.AF_INET, kind) for kind in kinds]
    try:
        for s in socks:
            s.bind(("127.0.0.1", port))
    except OSError:
        return False
    finally:
        for s in socks:
            s.close()
    return True


def quiet_ports(count: int = 1, width: int = 1, *, udp: bool = False) -> list[int]:
    """``count`` port numbers P, each with P..P+width-1 free on 127.0.0.1 now (for TCP, and
    for UDP too with ``udp``), no two runs overlapping, all below the ephemeral range."""
    low = _ephemeral_low()
    rng = random.Random()
    found: list[int] = []
    for _ in range(1000):
        if len(found) == count:
            return found
        port = rng.randrange(10_000, max(10_000 + width + 1, low - width))
        if any(abs(port - p) < width for p in found):
            continue
        if all(_bindable(port + k, udp) for k in range(width)):
            found.append(port)
    raise RuntimeError(f"no {count} runs of {width} free ports below {low}")
