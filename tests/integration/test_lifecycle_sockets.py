"""TCP_NODELAY on the router's client and upstream connections, read from the live sockets.

granian sets TCP_NODELAY on its listening socket and Linux copies it to accepted
sockets; this checks the real accepted socket inside each worker (pidfd_getfd, Linux
5.6+, needs ptrace rights on the worker: skipped where that is not allowed).
"""

from __future__ import annotations

import ctypes
import errno
import os
import socket

import pytest

import harness

SYS_PIDFD_GETFD = 438  # same number on x86_64 and aarch64


def _sockets_of(pid: int) -> list[socket.socket]:
    libc = ctypes.CDLL(None, use_errno=True)
    pidfd = os.pidfd_open(pid)
    out = []
    try:
        for name in os.listdir(f"/proc/{pid}/fd"):
            try:
                if not os.readlink(f"/proc/{pid}/fd/{name}").startswith("socket:"):
                    continue
            except OSError:
                continue
            fd = libc.syscall(SYS_PIDFD_GETFD, pidfd, int(name), 0)
            if fd < 0:
                err = ctypes.get_errno()
                if err == errno.EBADF:  # closed since we listed it
                    continue
                # the test needs it (CI's machine allows it): a refusal fails, it does not skip
                pytest.fail(f"pidfd_getfd({name}) failed: {os.strerror(err)}")
            out.append(socket.socket(fileno=fd))
    finally:
        os.close(pidfd)
    return out


def _tcp_peers(pid: int) -> list[tuple[tuple[str, int] | None, int]]:
    found = []
    for s in _sockets_of(pid):
        try:
            if s.family == socket.AF_INET and s.type == socket.SOCK_STREAM:
                try:
                    peer = s.getpeername()
                except OSError:
                    peer = None
                found.append((peer, s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)))
        finally:
            s.close()
    return found


def test_tcp_nodelay_on_client_and_upstream_sockets(router: harness.Router, simulator: harness.Simulator) -> None:
    # Keep-alive connections held open while we look at the worker's side of them.
    clients = []
    for _ in range(4 * router.workers):
        c = socket.create_connection((harness.HOST, router.port))
        body = b'{"model": "demo", "max_tokens": 2, "messages": [{"role": "user", "content": "x"}]}'
        c.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        assert c.recv(65536).startswith(b"HTTP/1.1 200")
        clients.append(c)
    try:
        ours = {c.getsockname() for c in clients}
        client_side, upstream_side = [], []
        for pid in router.worker_pids():
            for peer, nodelay in _tcp_peers(pid):
                if peer in ours:
                    client_side.append(nodelay)
                elif peer is not None and peer[1] in simulator.ports:
                    upstream_side.append(nodelay)
        assert len(client_side) == len(clients)
        assert all(client_side), client_side
        assert upstream_side, "no pooled upstream connection found"
        assert all(upstream_side), upstream_side
    finally:
        for c in clients:
            c.close()
