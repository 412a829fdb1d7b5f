"""kthena-controller: the ModelServing controller (`python -m controller`).

Flags follow Kthena's controller-manager where it has them (--kubeconfig, --workers,
--leader-elect; Lease `lease.kthena.controller-manager`). Leader election is on by default:
two replicas never act at once.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import sys
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .manager import AutoscalerConfig

__all__ = ["main"]

EXIT_USAGE = 2
LEASE_NAME = "lease.kthena.controller-manager"
_SA_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def _bool(text: str) -> bool:
    v = text.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kthena-controller", description="Kthena's ModelServing controller.")
    p.add_argument("--kubeconfig", default="", help="kubeconfig file (default: in-cluster service account)")
    p.add_argument("--context", default="", help="kubeconfig context")
    p.add_argument("--namespace", default="", help="only this namespace (default: all namespaces)")
    p.add_argument("--workers", type=int, default=5, help="concurrent reconciles (of different objects)")
    p.add_argument("--leader-elect", type=_bool, nargs="?", const=True, default=True,
                   help="hold a Lease before acting (default true; --leader-elect=false for one replica)")
    p.add_argument("--leader-elect-namespace", default="",
                   help="namespace of the Lease (default: $POD_NAMESPACE, the service account's, or default)")
    p.add_argument("--leader-elect-name", default=LEASE_NAME)
    p.add_argument("--leader-elect-identity", default="", help="default: <hostname>_<uuid>")
    p.add_argument("--leader-elect-lease-duration", type=float, default=15.0)
    p.add_argument("--leader-elect-renew-deadline", type=float, default=10.0)
    p.add_argument("--leader-elect-retry-period", type=float, default=2.0)
    p.add_argument("--model-booster", type=_bool, nargs="?", const=True, default=True,
                   help="also run the ModelBooster controller (default true; needs its CRDs)")
    p.add_argument("--model-booster-downloader-image", default="kthena/downloader:latest")
    p.add_argument("--model-booster-runtime-image", default="kthena/runtime:latest")
    p.add_argument("--autoscaler", type=_bool, nargs="?", const=True, default=True,
                   help="also run the AutoscalingPolicy controller (default true; needs its CRD)")
    p.add_argument("--autoscaler-dry-run", type=_bool, nargs="?", const=True, default=False,
                   help="log and report scaling decisions in the policies' status without changing replicas")
    p.add_argument("--autoscaler-period", type=float, default=15.0,
                   help="seconds between two evaluations of a policy (Kthena: 15)")
    p.add_argument("--autoscaler-scrape-timeout", type=float, default=3.0,
                   help="seconds for one pod metrics scrape or Prometheus query")
    p.add_argument("--router-metrics-url", action="append", default=[], metavar="URL",
                   help="a router's /metrics page (repeat for every router replica): router: policy metrics "
                        "and the pending-requests wake signal (scale from zero)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    # probes and metrics (controller/metrics.py); 0 turns one off, equal ports share a server
    p.add_argument("--bind-address", default="127.0.0.1",
                   help="address of the probe and metrics ports (0.0.0.0 in a pod: the kubelet probes the pod IP)")
    p.add_argument("--health-port", type=int, default=0, help="/healthz and /readyz (default: off)")
    p.add_argument("--metrics-port", type=int, default=0, help="Prometheus /metrics (default: off)")
    # crash tests only (tests/k8s/test_controller_crash.py): SIGKILL right after the k-th write
    p.add_argument("--exit-after-writes", type=int, default=0, help=argparse.SUPPRESS)
    return p


def _lease_namespace(flag: str) -> str:
    if flag:
        return flag
    if os.environ.get("POD_NAMESPACE"):
        return os.environ["POD_NAMESPACE"]
    try:
        return _SA_NAMESPACE.read_text().strip() or "default"
    except OSError:
        return "default"


def _autoscaler(args: argparse.Namespace, config: type[AutoscalerConfig]) -> AutoscalerConfig | None:
    """The autoscaler's settings from the flags (None: --autoscaler=false)."""
    if not args.autoscaler:
        if args.router_metrics_url:
            raise ValueError("--router-metrics-url is read by the autoscaler: not with --autoscaler=false")
        return None
    if args.autoscaler_period <= 0 or args.autoscaler_scrape_timeout <= 0:
        raise ValueError("--autoscaler-period and --autoscaler-scrape-timeout must be > 0")
    from .autoscaler.router_source import validate_router_url
    urls = tuple(dict.fromkeys(validate_router_url(u) for u in args.router_metrics_url))
    return config(args.autoscaler_dry_run, args.autoscaler_period, args.autoscaler_scrape_timeout, urls)


async def _run(args: argparse.Namespace) -> int:
    from kthena_router.kube.client import connect

    from .booster.common import Images
    from .manager import AutoscalerConfig, LeaseConfig, Manager, ServeConfig

    try:
        api = await connect(args.kubeconfig, args.context)
    except Exception as exc:
        where = args.kubeconfig or "in-cluster service account (use --kubeconfig outside a pod)"
        print(f"kthena-controller: cannot load Kubernetes credentials from {where}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    lease = None
    if args.leader_elect:
        lease = LeaseConfig(_lease_namespace(args.leader_elect_namespace), args.leader_elect_name,
                            args.leader_elect_identity or f"{socket.gethostname()}_{uuid.uuid4()}",
                            args.leader_elect_lease_duration, args.leader_elect_renew_deadline,
                            args.leader_elect_retry_period)
    try:
        images = (Images(args.model_booster_downloader_image, args.model_booster_runtime_image)
                  if args.model_booster else None)
        manager = Manager(api, namespace=args.namespace, workers=args.workers, lease=lease,
                          serve=ServeConfig(args.bind_address, args.health_port, args.metrics_port),
                          exit_after_writes=args.exit_after_writes, booster=images,
                          autoscaler=_autoscaler(args, AutoscalerConfig))
    except ValueError as exc:
        print(f"kthena-controller: {exc}", file=sys.stderr)
        await api.close()
        return EXIT_USAGE
    task = asyncio.create_task(manager.run())
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)
    try:
        return await task
    except asyncio.CancelledError:
        logging.getLogger("controller").info("stopped")
        return 0
    finally:
        await api.close()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return asyncio.run(_run(args))
