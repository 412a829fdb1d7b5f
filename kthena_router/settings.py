"""Router process settings, shared by the parent (supervisor) and the granian workers.

The parent builds a RouterSettings from the command line and hands it to every worker
through one environment variable holding JSON (SETTINGS_ENV). Workers read it when the
app factory runs (`from_env()`), never at import time.
"""

from __future__ import annotations

import os
import socket
import tempfile
import uuid
from pathlib import Path

import msgspec

SETTINGS_ENV = "KTHENA_ROUTER_SETTINGS"

# Names of the files inside runtime_dir (one place, so parent and workers agree).
PROMETHEUS_SUBDIR = "prometheus"
RELOAD_TRIGGER_NAME = "reload-trigger"
DRAIN_MARKER_NAME = "draining"
FRONT_SOCKET_NAME = "granian.sock"  # --interface rust
MAX_UNIX_PATH = 100  # sun_path is 108 bytes on Linux
SHORT_SOCKET_DIR_PREFIX = "ktr-"  # a private dir for a socket whose runtime-dir path is too long
KUBE_CONFIG_NAME = "kubernetes-config.yaml"  # Kubernetes mode: the config the supervisor renders
DEFAULT_LEASE_NAME = "kthena-router"
# In a pod: the downward API (configs/deploy/router/base/deployment.yaml) and the mounted token's namespace.
POD_NAMESPACE_ENV, POD_NAME_ENV = "POD_NAMESPACE", "POD_NAME"
SA_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


class SettingsError(ValueError):
    """Settings that cannot work (bad port, missing env var, ...)."""


class RouterSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Everything a router process needs besides the routing config file.

    Per-process scope: every granian worker receives the same settings; state derived
    from them (connection pools, health of endpoints, route table) is per worker.
    """

    config_path: str
    """Path of the YAML config file (ModelRoute / ModelServer / Endpoints documents)."""
    host: str = "127.0.0.1"
    """Client-facing listen address."""
    port: int = 8080
    """Client-facing listen port (0 is not allowed: workers share one fixed port)."""
    admin_host: str = "127.0.0.1"
    """Admin server address (/healthz, /readyz, /metrics, /admin/reload)."""
    admin_port: int = 15000
    """Admin server port (Kthena's router uses 15000 for its debug/admin port)."""
    workers: int = 1
    """Number of granian worker processes."""
    interface: str = "auto"
    """What serves the public port. `rust` (docs/rust-front.md): each worker's Rust front
    end; granian runs the full app (RSGI) on a unix socket for the slow path. `rsgi`
    (granian's native protocol) or `asgi` (its ASGI bridge): granian on the port
    (docs/overhead.md). `auto`: rust, or rsgi when the startup router configuration has
    auth or fair queuing (front/choice.py)."""
    front_threads: int = 1
    """--interface rust: tokio threads of each worker's front end."""
    front_table: bool = True
    """--interface rust: the front decides plain round-robin routes itself, without asking
    Python per request (front/table.py); off: Python decides every completion."""
    max_body_bytes: int = 32 * 1024 * 1024
    """Request bodies above this size are refused with 413."""
    drain_grace_s: float = 30.0
    """On SIGTERM: how long in-flight requests (incl. streams) may run before exit."""
    log_level: str = "warning"
    """Python logging level name for parent and workers (debug|info|warning|error)."""
    runtime_dir: str = ""
    """Directory for prometheus multiprocess files, reload trigger and worker status.
    Empty: the supervisor creates a fresh one under the OS temp dir."""
    reload_trigger_path: str = ""
    """File whose change makes every worker's ConfigWatcher reload the config.
    Empty: `<runtime_dir>/reload-trigger` (filled in by `resolved()`)."""
    health_probe_interval_s: float = 2.0
    """Period of the active /health probe of every endpoint."""
    health_probe_timeout_s: float = 1.0
    """Timeout of one active /health probe."""
    default_retry_endpoints: int = 2
    """Candidates tried before the first byte when the ModelServer sets no retry policy."""
    upstream_pool_size: int = 512
    """Max pooled upstream connections per worker (all endpoints together). Upstream
    timeouts are not settings: they are the router configuration's `traffic` section."""
    route_seed: int | None = None
    """Seed of the weighted-target draw (each worker seeds its own generator with it);
    None: seeded from the OS. A seed makes a 1-worker run's split reproducible."""
    watch_config: bool = True
    """Watch the config file's directory and reload on change."""
    router_config_path: str = ""
    """Kthena routerConfiguration file (scheduler plugins). Empty: round-robin among healthy
    endpoints and no engine scraping (step-1 behaviour). Read once per worker at start."""
    scrape_interval_s: float = 1.0
    """Period of each endpoint's /metrics + /v1/models scrape (only with a router config)."""
    warmup_timeout_s: float = 10.0
    """With a router configuration, /readyz waits at most this long after the first config
    with endpoints for every engine's first scrape and KV-event stream (warmup.py)."""
    hot_spot_abs: float = 64.0
    """Hot-spot guard: the affinity choice must be more than this many requests busier ...
    (64 as sglang-router's balance_abs_threshold; smaller values break affinity on normal
    batching variance, see docs/benchmarks.md)."""
    hot_spot_rel: float = 1.5
    """... and more than this many times busier than the least loaded one for load to win."""
    access_log: str = ""
    """Access log destination: a file path (appended to), "-" for stdout, empty: off."""
    access_log_flush_s: float = 1.0
    """Access log lines are buffered and written at most this long after the request."""
    response_id_cache_size: int = 100_000
    """Responses API: response ids (-> the engine that stored them) remembered per worker."""
    kubernetes: bool = False
    """Kubernetes mode: the supervisor watches the cluster and renders the config into
    `<runtime_dir>/kubernetes-config.yaml` (config_path), which the workers load and watch."""
    kubeconfig: str = ""
    """Kubernetes mode: kubeconfig file; empty = in-cluster service-account credentials."""
    kube_context: str = ""
    """Kubernetes mode: kubeconfig context (empty: its current-context)."""
    namespace: str = ""
    """Kubernetes mode: watch this namespace only (a Role suffices); empty = every namespace."""
    kube_watch_timeout_s: float = 300.0
    """Kubernetes mode: server-side timeout of one watch request (then it resumes from the last
    resourceVersion; also how soon a revoked permission is noticed)."""
    kube_status: bool = True
    """Kubernetes mode: write the status of the watched objects (the Lease holder only) and
    campaign for the Lease; off with --no-status (then no Lease and no write permission needed)."""
    lease_name: str = DEFAULT_LEASE_NAME
    """Kubernetes mode: name of the coordination.k8s.io Lease electing the status writer."""
    lease_namespace: str = ""
    """Kubernetes mode: the Lease's namespace (the router's own). Empty: filled in at startup by
    `with_kube_identity()` from POD_NAMESPACE, the service account's namespace file, --namespace,
    else "default"."""
    leader_identity: str = ""
    """Kubernetes mode: this replica's holderIdentity in the Lease. Empty: filled in at startup
    from POD_NAME, else `<hostname>_<random>`."""
    pod_state: str = "auto"
    """With several workers: "auto" runs one pod-state hub (scrapes, probes and relays
    prefix-index inserts once per pod, docs/pod-state.md); "off": every worker on its own."""
    pod_state_socket: str = ""
    """The hub's unix socket; set by the supervisor when it starts a hub (empty: no hub)."""
    pod_id: str = ""
    """This router process' random id, shared by its workers; set with `pod_state_socket`.
    sharedPrefixIndex records carry it, so a worker skips its own pod's records while the
    hub already relays them (counted once, not twice)."""
    front_socket: str = ""
    """--interface rust: granian's unix socket when <runtime_dir>/granian.sock is too long
    for a unix socket path; set by the supervisor (empty: that default)."""
    app_factory: str = "kthena_router.app:create_app"
    """granian target (module:factory) of the workers; changed only by tests of the supervisor."""

    # --- derived helpers -------------------------------------------------------------

    def socket_in_runtime_dir(self, name: str) -> str:
        """<runtime_dir>/<name>, or <name> in a private short directory when that path is
        too long for a unix socket (a deep runtime dir)."""
        path = str(Path(self.runtime_dir) / name)
        if len(path.encode()) > MAX_UNIX_PATH:
            path = str(Path(tempfile.mkdtemp(prefix=SHORT_SOCKET_DIR_PREFIX)) / name)
        return path

    def resolved(self) -> "RouterSettings":
        """Copy with absolute paths and defaults that depend on runtime_dir filled in."""
        config_path = self.config_path
        if self.kubernetes and not config_path and self.runtime_dir:
            config_path = str(Path(self.runtime_dir) / KUBE_CONFIG_NAME)
        if config_path:
            config_path = str(Path(config_path).expanduser().resolve())
        kubeconfig = str(Path(self.kubeconfig).expanduser().resolve()) if self.kubeconfig else ""
        router_config = self.router_config_path
        if router_config:
            router_config = str(Path(router_config).expanduser().resolve())
        access_log = self.access_log
        if access_log and access_log != "-":
            access_log = str(Path(access_log).expanduser().resolve())
        trigger = self.reload_trigger_path
        if not trigger and self.runtime_dir:
            trigger = str(Path(self.runtime_dir) / RELOAD_TRIGGER_NAME)
        return msgspec.structs.replace(self, config_path=config_path, reload_trigger_path=trigger,
                                       kubeconfig=kubeconfig, router_config_path=router_config, access_log=access_log)

    def with_kube_identity(self, environ: "os._Environ[str] | dict[str, str] | None" = None,
                           sa_namespace_file: str = SA_NAMESPACE_FILE) -> "RouterSettings":
        """Kubernetes mode, at startup (the parent): the Lease's namespace and this replica's
        identity when not given, from the pod's environment (never read at import)."""
        if not self.kubernetes or not self.kube_status:
            return self
        env = os.environ if environ is None else environ
        namespace = self.lease_namespace or env.get(POD_NAMESPACE_ENV, "").strip()
        if not namespace and not self.kubeconfig:  # in-cluster: the service account's namespace
            try:
                namespace = Path(sa_namespace_file).read_text().strip()
            except OSError:
                namespace = ""
        namespace = namespace or self.namespace or "default"
        identity = self.leader_identity or env.get(POD_NAME_ENV, "").strip()
        if not identity:  # client-go's default: unique per process, readable in the Lease
            identity = f"{socket.gethostname()}_{uuid.uuid4().hex[:10]}"
        return msgspec.structs.replace(self, lease_namespace=namespace, leader_identity=identity)

    def validate(self) -> None:
        """Raise SettingsError on values that cannot work."""
        for name in ("port", "admin_port"):
            value = getattr(self, name)
            if not 1 <= value <= 65535:
                raise SettingsError(f"{name} must be in 1..65535, got {value}")
        if self.workers < 1:
            raise SettingsError(f"workers must be >= 1, got {self.workers}")
        if self.interface not in ("auto", "rsgi", "asgi", "rust"):
            raise SettingsError(f"interface must be auto, rsgi, asgi or rust, got {self.interface!r}")
        if self.front_threads < 1:
            raise SettingsError(f"front_threads must be >= 1, got {self.front_threads}")
        if self.front_threads != 1 and self.interface not in ("rust", "auto"):
            raise SettingsError("front_threads (--front-threads) applies to --interface rust (or auto) only")
        if not self.front_table and self.interface not in ("rust", "auto"):
            raise SettingsError("front_table (--front-table off) applies to --interface rust (or auto) only")
        if self.upstream_pool_size < 1:
            raise SettingsError(f"upstream_pool_size must be >= 1, got {self.upstream_pool_size}")
        if self.max_body_bytes < 1:
            raise SettingsError(f"max_body_bytes must be >= 1, got {self.max_body_bytes}")
        if self.drain_grace_s < 0:
            raise SettingsError(f"drain_grace_s must be >= 0, got {self.drain_grace_s}")
        if self.pod_state not in ("auto", "off"):
            raise SettingsError(f"pod_state must be auto or off, got {self.pod_state!r}")
        if self.warmup_timeout_s < 0:
            raise SettingsError(f"warmup_timeout_s must be >= 0, got {self.warmup_timeout_s}")
        if self.scrape_interval_s <= 0:
            raise SettingsError(f"scrape_interval_s must be > 0, got {self.scrape_interval_s}")
        if self.hot_spot_abs < 0 or self.hot_spot_rel < 1:
            raise SettingsError(f"need hot_spot_abs >= 0 and hot_spot_rel >= 1, got {self.hot_spot_abs}, "
                                f"{self.hot_spot_rel}")
        if self.access_log_flush_s <= 0:
            raise SettingsError(f"access_log_flush_s must be > 0, got {self.access_log_flush_s}")
        if self.response_id_cache_size < 1:
            raise SettingsError(f"response_id_cache_size must be >= 1, got {self.response_id_cache_size}")
        if self.kube_watch_timeout_s < 1:
            raise SettingsError(f"kube_watch_timeout_s must be >= 1, got {self.kube_watch_timeout_s}")
        if self.kubernetes and self.kube_status and not self.lease_name:
            raise SettingsError("the status Lease needs a name (--status-lease-name)")
        if not self.kubernetes and not self.config_path:
            raise SettingsError("a config file (--config) or Kubernetes mode (--kubernetes) is required")
        if self.log_level.lower() not in ("debug", "info", "warning", "error", "critical"):
            raise SettingsError(f"log_level must be debug|info|warning|error, got {self.log_level!r}")

    @property
    def prometheus_dir(self) -> str:
        return str(Path(self.runtime_dir) / PROMETHEUS_SUBDIR) if self.runtime_dir else ""

    @property
    def front_socket_path(self) -> str:
        """--interface rust: granian's unix socket (the full app, the front's slow path)."""
        if self.front_socket:
            return self.front_socket
        return str(Path(self.runtime_dir) / FRONT_SOCKET_NAME) if self.runtime_dir else ""

    @property
    def drain_marker_path(self) -> str:
        """Exists while the parent drains (workers may read it, e.g. to close keep-alives)."""
        return str(Path(self.runtime_dir) / DRAIN_MARKER_NAME) if self.runtime_dir else ""

    # --- transport to workers ----------------------------------------------------------

    def to_json(self) -> str:
        return msgspec.json.encode(self).decode()

    def to_env(self) -> dict[str, str]:
        """Environment entries that carry these settings to the workers."""
        return {SETTINGS_ENV: self.to_json()}

    @classmethod
    def from_json(cls, data: str | bytes) -> "RouterSettings":
        try:
            return msgspec.json.decode(data, type=cls)
        except msgspec.ValidationError as exc:
            raise SettingsError(f"invalid router settings: {exc}") from exc

    @classmethod
    def from_env(cls, environ: "os._Environ[str] | dict[str, str] | None" = None) -> "RouterSettings":
        """Settings of this worker; call from the app factory, not at import."""
        env = os.environ if environ is None else environ
        raw = env.get(SETTINGS_ENV)
        if not raw:
            raise SettingsError(
                f"{SETTINGS_ENV} is not set: start the router with `kthena-router --config FILE`"
            )
        return cls.from_json(raw)
