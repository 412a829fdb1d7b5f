"""KV-event port blocks come from below the kernel's ephemeral range: a port there cannot be
handed to another socket's automatic bind between the check and the simulator's bind (CI
once lost a module to `address already in use` on a block inside that range)."""

import socket
from pathlib import Path

from loadtest.shared_prefix import cluster


def test_block_lies_below_the_ephemeral_range_and_is_free() -> None:
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for _ in range(20):
        base = cluster.free_port_block(8)
        assert 10000 <= base and base + 8 <= low
        with socket.socket() as s:  # still free: it can be bound
            s.bind((cluster.HOST, base))
