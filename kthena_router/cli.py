"""`kthena-router`: parse arguments, validate the config once, run the supervisor.

Exit codes: 0 clean stop, 1 runtime failure (workers crashed), 2 invalid arguments or
config (the message names file, document and field), 3 a port is already in use.
"""

from __future__ import annotations

import argparse
import errno
import logging
import logging.config
import sys
from typing import Any

from kthena_router.settings import RouterSettings, SettingsError

EXIT_USAGE = 2
EXIT_PORT_IN_USE = 3


def build_parser() -> argparse.ArgumentParser:
    d = RouterSettings(config_path="")
    p = argparse.ArgumentParser(
        prog="kthena-router",
        description="OpenAI-compatible LLM router (Kthena drop-in): config-file mode (--config) or "
                    "Kubernetes mode (--kubernetes, docs/kubernetes.md).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--config", "-c", metavar="FILE",
                        help="YAML file with ModelRoute / ModelServer / Endpoints documents")
    source.add_argument("--kubernetes", action="store_true",
                        help="follow the cluster: watch ModelRoute, ModelServer, ExternalModelProvider, their "
                             "credential Secrets and Pods (in-cluster credentials unless --kubeconfig)")
    p.add_argument("--kubeconfig", default="", metavar="FILE",
                   help="Kubernetes mode: kubeconfig file (default: in-cluster service-account credentials)")
    p.add_argument("--kube-context", default="", help="Kubernetes mode: kubeconfig context (default: current)")
    p.add_argument("--namespace", default="",
                   help="Kubernetes mode: watch only this namespace (a Role suffices); default: all namespaces")
    p.add_argument("--kube-watch-timeout-s", type=float, default=d.kube_watch_timeout_s,
                   help="Kubernetes mode: server-side timeout of one watch request (it then resumes)")
    p.add_argument("--no-status", dest="kube_status", action="store_false",
                   help="Kubernetes mode: do not write the objects' status (and hold no Lease); "
                        "default: the replica holding the Lease writes it (docs/kubernetes-status.md)")
    p.add_argument("--status-lease-name", dest="lease_name", default=d.lease_name, metavar="NAME",
                   help="Kubernetes mode: the coordination.k8s.io Lease electing the replica that writes status")
    p.add_argument("--status-lease-namespace", dest="lease_namespace", default="", metavar="NS",
                   help="Kubernetes mode: the Lease's namespace (default: $POD_NAMESPACE, the in-cluster "
                        "service account's namespace, --namespace, else default)")
    p.add_argument("--leader-identity", default="", metavar="ID",
                   help="Kubernetes mode: this replica's holderIdentity in the Lease (default: $POD_NAME, "
                        "else HOSTNAME_RANDOM)")
    p.add_argument("--host", default=d.host, help="client-facing listen address")
    p.add_argument("--port", type=int, default=d.port, help="client-facing listen port")
    p.add_argument("--admin-host", default=d.admin_host, help="admin server address")
    p.add_argument("--admin-port", type=int, default=d.admin_port,
                   help="admin server port (/healthz, /readyz, /metrics, /admin/reload)")
    p.add_argument("--workers", type=int, default=d.workers, help="granian worker processes")
    p.add_argument("--interface", choices=["auto", "rust", "rsgi", "asgi"], default=d.interface,
                   help="what serves the public port: rust (a Rust front end per worker, docs/rust-front.md), "
                        "rsgi or asgi (granian); auto (default): rust unless the router configuration has "
                        "auth or fair queuing, then rsgi")
    p.add_argument("--front-threads", type=int, default=d.front_threads,
                   help="--interface rust (or auto choosing it): tokio threads of each worker's front end")
    p.add_argument("--front-table", choices=["on", "off"], default="on" if d.front_table else "off",
                   help="--interface rust (or auto choosing it): the front decides plain round-robin routes "
                        "itself (on, default) or asks Python for every completion (off)")
    p.add_argument("--max-body-bytes", type=int, default=d.max_body_bytes,
                   help="larger request bodies get 413")
    p.add_argument("--drain-grace-s", "--drain-grace", dest="drain_grace_s", type=float,
                   default=d.drain_grace_s, help="on SIGTERM, seconds in-flight requests may still run")
    p.add_argument("--log-level", default=d.log_level,
                   choices=["debug", "info", "warning", "error", "critical"])
    p.add_argument("--runtime-dir", default="",
                   help="dir for metrics files, reload trigger, worker status (default: a fresh temp dir)")
    p.add_argument("--health-probe-interval-s", type=float, default=d.health_probe_interval_s,
                   help="period of active /health probes of endpoints")
    p.add_argument("--upstream-pool-size", type=int, default=d.upstream_pool_size,
                   help="max upstream connections per worker, all endpoints together (waits beyond it "
                        "are bounded by the router configuration's traffic.timeouts.poolWait)")
    p.add_argument("--route-seed", type=int, default=None,
                   help="seed of the weighted (canary) target draw, for reproducible splits")
    p.add_argument("--router-config", dest="router_config_path", default="", metavar="FILE",
                   help="Kthena routerConfiguration YAML (scheduler plugins; ours: traffic: timeouts, "
                        "outlier detection, admission, buffered-reply cap; reloaded like --config). "
                        "Without it: round-robin among healthy endpoints")
    p.add_argument("--pod-state", default=d.pod_state, choices=["auto", "off"],
                   help="with several workers: one process per pod scrapes, probes and shares the "
                        "prefix index (auto), or every worker on its own (off)")
    p.add_argument("--scrape-interval-s", type=float, default=d.scrape_interval_s,
                   help="engine /metrics + /v1/models scrape period (with --router-config)")
    p.add_argument("--warmup-timeout-s", type=float, default=d.warmup_timeout_s,
                   help="longest wait of /readyz at start for the engines' first scrape and KV-event "
                        "streams (with --router-config)")
    p.add_argument("--hot-spot-abs", type=float, default=d.hot_spot_abs,
                   help="hot-spot guard: absolute load excess (requests) before a request leaves its best endpoint")
    p.add_argument("--hot-spot-rel", type=float, default=d.hot_spot_rel,
                   help="hot-spot guard: relative load excess (times) before a request leaves its best endpoint")
    p.add_argument("--access-log", default="", metavar="FILE|-",
                   help="JSON-lines access log (one line per proxied request, no prompt text); "
                        "'-' for stdout; off when empty")
    p.add_argument("--access-log-flush-s", type=float, default=d.access_log_flush_s,
                   help="longest delay before buffered access-log lines are written")
    p.add_argument("--response-id-cache-size", type=int, default=d.response_id_cache_size,
                   help="Responses API ids remembered per worker (routes previous_response_id and GET by id)")
    return p


def settings_from_args(args: argparse.Namespace) -> RouterSettings:
    settings = RouterSettings(
        config_path=args.config or "",
        kubernetes=args.kubernetes,
        kubeconfig=args.kubeconfig,
        kube_context=args.kube_context,
        namespace=args.namespace,
        kube_watch_timeout_s=args.kube_watch_timeout_s,
        kube_status=args.kube_status,
        lease_name=args.lease_name,
        lease_namespace=args.lease_namespace,
        leader_identity=args.leader_identity,
        host=args.host,
        port=args.port,
        admin_host=args.admin_host,
        admin_port=args.admin_port,
        workers=args.workers,
        interface=args.interface,
        front_threads=args.front_threads,
        front_table=args.front_table == "on",
        max_body_bytes=args.max_body_bytes,
        drain_grace_s=args.drain_grace_s,
        log_level=args.log_level,
        runtime_dir=args.runtime_dir,
        health_probe_interval_s=args.health_probe_interval_s,
        route_seed=args.route_seed,
        upstream_pool_size=args.upstream_pool_size,
        router_config_path=args.router_config_path,
        scrape_interval_s=args.scrape_interval_s,
        warmup_timeout_s=args.warmup_timeout_s,
        pod_state=args.pod_state,
        hot_spot_abs=args.hot_spot_abs,
        hot_spot_rel=args.hot_spot_rel,
        access_log=args.access_log,
        access_log_flush_s=args.access_log_flush_s,
        response_id_cache_size=args.response_id_cache_size,
    ).resolved().with_kube_identity()
    settings.validate()
    return settings


def _check_router_config(path: str) -> int:
    """Load the routerConfiguration and build its scorer once, as the workers will."""
    from kthena_router.config.errors import ConfigError
    from kthena_router.scheduling.check import validate_router_configuration

    try:
        rc = validate_router_configuration(path)
    except ConfigError as exc:
        print(f"kthena-router: invalid router configuration:\n{exc}", file=sys.stderr)
        return EXIT_USAGE
    for warning in rc.warnings:
        logging.getLogger("kthena_router.scheduling").warning("%s", warning)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # Parent logging; workers get the same config through granian (supervisor.logging_config).
    from kthena_router.supervisor import logging_config

    logging.config.dictConfig(logging_config(args.log_level))
    try:
        settings = settings_from_args(args)
    except SettingsError as exc:
        print(f"kthena-router: {exc}", file=sys.stderr)
        return EXIT_USAGE

    kube_only = (args.kubeconfig or args.kube_context or args.namespace or not args.kube_status
                 or args.lease_name != RouterSettings(config_path="").lease_name or args.lease_namespace
                 or args.leader_identity)
    if not settings.kubernetes and kube_only:
        print("kthena-router: --kubeconfig, --kube-context, --namespace, --no-status, --status-lease-name, "
              "--status-lease-namespace and --leader-identity need --kubernetes", file=sys.stderr)
        return EXIT_USAGE
    config = None
    if settings.kubernetes:
        code = _check_kube_credentials(settings)
        if code:
            return code
    else:
        config = _load_config(settings)
        if config is None:
            return EXIT_USAGE
    if settings.router_config_path:
        code = _check_router_config(settings.router_config_path)
        if code:
            return code

    from kthena_router import supervisor

    try:
        return supervisor.run(settings, config)
    except SettingsError as exc:  # --interface auto resolved against the router configuration
        print(f"kthena-router: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except supervisor.PortInUseError as exc:
        print(f"kthena-router: {exc.strerror}", file=sys.stderr)
        return EXIT_PORT_IN_USE
    except OSError as exc:
        print(f"kthena-router: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_PORT_IN_USE if exc.errno == errno.EADDRINUSE else 1


def _check_kube_credentials(settings: RouterSettings) -> int:
    """Load the kubeconfig (or in-cluster credentials) once: a wrong file is a usage error.
    The apiserver itself is not contacted here (it may be down; the watch retries)."""
    import asyncio

    from kthena_router.kube.client import connect

    async def check() -> None:
        api = await connect(settings.kubeconfig, settings.kube_context)
        await api.close()

    try:
        asyncio.run(check())
    except Exception as exc:
        where = settings.kubeconfig or "in-cluster service account (use --kubeconfig outside a pod)"
        print(f"kthena-router: cannot load Kubernetes credentials from {where}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return 0


def _load_config(settings: RouterSettings) -> Any:
    """The config file, validated (None after printing why it cannot be used)."""
    from kthena_router.config.errors import ConfigError
    from kthena_router.config.loader import load_config_file

    try:
        config = load_config_file(settings.config_path)
    except ConfigError as exc:
        print(f"kthena-router: invalid config:\n{exc}", file=sys.stderr)
        return None
    except OSError as exc:
        print(f"kthena-router: cannot read config {settings.config_path}: {exc.strerror or exc}",
              file=sys.stderr)
        return None
    for warning in config.warnings:
        logging.getLogger("kthena_router.config").warning("%s", warning)
    return config


if __name__ == "__main__":
    sys.exit(main())
