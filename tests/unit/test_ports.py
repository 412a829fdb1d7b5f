"""Ports picked for child processes: outside the kernel's ephemeral range (no automatic bind
can take one before the child binds it), never handed out twice in a row by one process,
and skipping ports in use. CI lost tests to both races before (a KV-event block, then a
router port taken between the pick and the bind)."""

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from loadtest import ports


def test_pool_lies_outside_the_ephemeral_range() -> None:
    e_low, e_high = ports.ephemeral_range()
    low, high = ports.pool_range()
    assert high <= e_low or low > e_high
    picked = ports.free_ports(40) + [ports.free_port_block(8) + i for i in range(8)]
    assert all(low <= p < high for p in picked)
    assert all(not e_low <= p <= e_high for p in picked)


def test_successive_picks_never_repeat_a_port() -> None:
    seen: list[int] = []
    for _ in range(50):
        seen += ports.free_ports(3)
    seen.append(ports.free_port_block(4))
    assert len(seen) == len(set(seen))
    for p in seen[:10]:  # still free: a child can bind them
        assert ports.bindable(p)


def test_a_port_in_use_is_skipped_and_a_block_restarts_after_it() -> None:
    base = ports.free_port_block(9)  # below the ephemeral range: nothing else takes these
    busy = base + 3
    with socket.socket() as held:
        held.bind((ports.HOST, busy))
        block = ports.PortPool(base, base + 9, start=base).take(4, consecutive=True)
        assert block == [busy + 1, busy + 2, busy + 3, busy + 4]
        assert busy not in ports.PortPool(busy, busy + 3, start=busy).take(2)


def test_a_block_does_not_span_the_wrap() -> None:
    base = ports.free_port_block(6)
    pool = ports.PortPool(base, base + 6, start=base + 4)
    assert pool.take(3, consecutive=True) == [base, base + 1, base + 2]


def test_an_exhausted_pool_raises() -> None:
    port = ports.free_port_block(2)
    with socket.socket() as a, socket.socket() as b:
        a.bind((ports.HOST, port))
        b.bind((ports.HOST, port + 1))
        with pytest.raises(OSError, match="no 1 free ports"):
            ports.PortPool(port, port + 2).take(1)


def test_processes_start_their_walks_apart() -> None:
    code = "from loadtest import ports; print(ports.free_ports(1)[0])"
    firsts = {int(subprocess.check_output([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[2], text=True))
              for _ in range(4)}
    assert len(firsts) >= 3  # random starts in a pool of thousands of ports
