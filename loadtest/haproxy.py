"""A real L4 balancer (Debian's haproxy) in front of several router replicas.

Shared by the benchmarks (loadtest/shared_prefix, `--replicas N`) and the tests
(tests/haproxy_harness.py wraps it with the tests' process manager). TCP mode (haproxy
never parses HTTP), `balance roundrobin`: each new client connection goes to the next
replica, as behind a Kubernetes Service or a cloud L4 load balancer. Foreground (`-db`:
no daemon, no master process), its own config file in the caller's log directory.
`make haproxy` installs it when missing.
"""

from __future__ import annotations

import shutil
import socket
from collections.abc import Sequence
from pathlib import Path

from loadtest.procs import HOST, Proc, StartError, free_ports, wait_until

HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"

_CONFIG = """\
global
    maxconn 4096
    log stdout format raw local0 info

defaults
    mode tcp
    log global
    option tcplog
    timeout connect 5s
    timeout client 600s
    timeout server 600s

frontend routers
    bind {host}:{port}
    default_backend replicas

backend replicas
    balance roundrobin
{servers}
"""


def render_config(port: int, backends: Sequence[int], host: str = HOST) -> str:
    """The haproxy.cfg: one frontend on host:port, one server line per backend port (no
    health checks: a replica that is down fails its connections, which a caller can see)."""
    servers = "\n".join(f"    server r{i} {host}:{p}" for i, p in enumerate(backends))
    return _CONFIG.format(host=host, port=port, servers=servers)


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=1.0):
            return True
    except OSError:
        return False


def start(logdir: Path, procs: list[Proc], backends: Sequence[int], timeout_s: float = 30.0) -> str:
    """Check the config, start haproxy (appended to `procs`), wait for its port; its URL."""
    if not Path(HAPROXY).exists():
        raise StartError(f"haproxy not found ({HAPROXY}); `make haproxy` installs it")
    [port] = free_ports(1)
    cfg = logdir / f"haproxy-{port}.cfg"
    cfg.write_text(render_config(port, backends))
    check = Proc("haproxy-check", [HAPROXY, "-c", "-f", str(cfg)], logdir)
    rc = check.popen.wait(30)
    check.stop()
    if rc != 0:
        raise StartError(f"haproxy rejected its config\n{check.tail()}")
    p = Proc("haproxy", [HAPROXY, "-db", "-f", str(cfg)], logdir)
    procs.append(p)
    wait_until(lambda: _accepts(port), p, timeout_s, f"haproxy accepting on {port}")
    return f"http://{HOST}:{port}"
