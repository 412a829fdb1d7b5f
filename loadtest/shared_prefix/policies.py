"""The policy table: every routing setup the runner can put in front of the engines.

One place to edit for the router's scheduling setups: a `router` policy
is our router with a Kthena routerConfiguration (YAML text written to a file and passed
with ROUTER_CONFIG_FLAG) plus extra CLI args. `--policy-config NAME=PATH` on the runner
replaces a policy's YAML with a file (e.g. to try "best" variants without editing here).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal


# The router CLI's flag for the routerConfiguration file.
ROUTER_CONFIG_FLAG = "--router-config"
# Our best configuration, shipped as a file (one setting for every regime; docs/benchmarks.md).
BEST_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "scheduling" / "best.yaml"
PHB_CONFIG = BEST_CONFIG.with_name("prefix-hash-bounded.yaml")

GREEDY = "greedy-reference"  # the runner's own lowest-predicted-TTFT chooser (greedy.py)
# earlier names, still accepted on the command line
ALIASES = {"oracle": GREEDY}
MODEL = "llama-3-8b-sim"  # the served model name of the benchmark's engines
Kind = Literal["router", "greedy", "direct", "peer", "partition"]


@dataclass(frozen=True)
class Policy:
    name: str
    kind: Kind
    scheduler_yaml: str | None = None  # routerConfiguration; None: the router's default
    router_args: tuple[str, ...] = ()
    peer: str | None = None  # "sglang" | "vllm" | "smg" for kind == "peer"
    peer_policy: str = "cache_aware"  # the peer's --policy
    partition: str = ""  # kind == "partition": which map (partition.py)
    note: str = ""
    kv_events: bool = False  # engines publish KV events and the router subscribes
    # the file scheduler_yaml was read from: passed as is, so that its relative paths
    # (tokenizers) resolve against its own directory
    config_file: Path | None = None
    # router replicas behind one haproxy (round-robin per connection); "NAME@N" on the
    # runner's command line sets it (scale-out comparisons: docs/scale-out.md)
    replicas: int = 1
    # a Redis per cell, its address added to the routerConfiguration as sharedPrefixIndex
    shared_index: bool = False
    # with kv_events: the engines whose Endpoints carry the KV-event labels (None: all);
    # the others publish too but the router is not told (a mixed fleet)
    kv_labelled: tuple[int, ...] | None = None

    @property
    def needs_kv_events(self) -> bool:
        return self.kv_events or uses_kv_events(self.scheduler_yaml)


def uses_kv_events(scheduler_yaml: str | None) -> bool:
    """Whether a routerConfiguration subscribes to KV events: kvcache-aware listed as a
    Score plugin, or a prefix-cache pipeline with kvcache-aware's tokenizers (the router's
    automatic exact matching, docs/kv-exact-default.md). Decided by the router's own parser
    and rule, not a copy; an invalid configuration raises the router's ConfigError."""
    if not scheduler_yaml:
        return False
    from kthena_router.scheduling.config import load_router_configuration_bytes
    from kthena_router.scheduling.exact_auto import auto_exact_args

    rc = load_router_configuration_bytes(scheduler_yaml, "policy configuration")
    return rc.scheduler.enabled("kvcache-aware") or \
        auto_exact_args(rc.scheduler, rc.kv_events) is not None


def _scorers(*names_weights: tuple[str, int], filters: tuple[str, ...] = ()) -> str:
    score = "\n".join(f"      - {{name: {n}, weight: {w}}}" for n, w in names_weights)
    filt = f"    Filter: {{enabled: [{', '.join(filters)}]}}\n" if filters else ""
    return ("scheduler:\n  plugins:\n" + filt + "    Score:\n      enabled:\n" + score + "\n")


# kvcache-aware tokenizes locally with the simulator's tokenizer (the engines' hash seed is
# the simulator's default, 0); event addresses come from the Endpoints labels (cluster.py).
_TOKENIZER = Path(__file__).resolve().parents[1] / "simulator" / "tokenizer" / "tokenizer.json"
_KV_ARGS = ("scheduler:\n  pluginConfig:\n  - name: kvcache-aware\n"
            f"    args: {{tokenizers: {{{MODEL}: '{_TOKENIZER}'}}, hashSeed: '0'}}\n")

# best.yaml's pipeline with kvcache-aware's tokenizers (automatic exact matching applies)
_BEST_TOK = _KV_ARGS + _scorers(("prefix-cache", 1), ("least-request", 1),
                                 ("lora-affinity", 1)).removeprefix("scheduler:\n")

POLICIES: dict[str, Policy] = {p.name: p for p in (
    # our router's built-in balancer (works before the plugins exist)
    Policy("round-robin", "router", note="router default balancer"),
    Policy("random", "router", _scorers(("random", 1))),
    Policy("least-request", "router", _scorers(("least-request", 1))),
    Policy("gpu-usage", "router", _scorers(("gpu-usage", 1))),
    Policy("least-latency", "router", _scorers(("least-latency", 1))),
    Policy("prefix-cache+least-request", "router",
           _scorers(("prefix-cache", 1), ("least-request", 1))),
    Policy("kvcache-aware+least-request", "router",
           _KV_ARGS + _scorers(("kvcache-aware", 1),
                               ("least-request", 1)).removeprefix("scheduler:\n"),
           note="published winner"),
    # our recommended configuration (configs/scheduling/best.yaml): prefix-cache +
    # least-request + lora-affinity; its own row so that its file is what the table measures
    Policy("best", "router", BEST_CONFIG.read_text(), note="ours, configs/scheduling/best.yaml",
           config_file=BEST_CONFIG),
    # the same, every request decided by Python (the A/B of the Rust front's own decision,
    # docs/rust-front.md "The scheduler in the table")
    Policy("best-py", "router", BEST_CONFIG.read_text(), router_args=("--front-table", "off"),
           note="best.yaml, --front-table off", config_file=BEST_CONFIG),
    # scale-out options (run them as NAME@3): shared approximate index in Redis, and
    # consistent hashing with bounded loads (no shared state)
    Policy("redis-index", "router", BEST_CONFIG.read_text(), shared_index=True,
           note="best.yaml + sharedPrefixIndex (a Redis per cell)"),
    Policy("prefix-hash-bounded", "router", PHB_CONFIG.read_text(),
           note="configs/scheduling/prefix-hash-bounded.yaml", config_file=PHB_CONFIG),
    # a mixed fleet (docs/kv-exact-default.md, "Mixed fleet"): engines 0 and 1 labelled with
    # their KV-event ports, engine 2 not; best.yaml + kvcache-aware's tokenizers, exact
    # matching automatic (labelled engines) or off (the approximate index alone)
    Policy("best-mixed-auto", "router", _BEST_TOK, kv_events=True, kv_labelled=(0, 1),
           note="best.yaml + tokenizers, kvEvents auto, 2 of 3 engines labelled"),
    Policy("best-mixed-off", "router", _BEST_TOK + "kvEvents: {exactMatching: off}\n",
           kv_events=True, kv_labelled=(0, 1), note="the same, kvEvents off"),
    Policy(GREEDY, "greedy", note="one-step greedy: lowest predicted TTFT (greedy.py)"),
    Policy("direct", "direct", note="client round-robin straight to the engines"),
    # hard workloads only: each group pinned to one engine, no router (partition.py)
    Policy("partition-first-seen", "partition", partition="first-seen",
           note="groups round-robin over the engines in first-seen order"),
    Policy("partition-hindsight", "partition", partition="hindsight",
           note="the same counts, swapped to even the burst's requests (reads the future)"),
    Policy("sglang-cache-aware", "peer", peer="sglang"),
    Policy("vllm-router-cache-aware", "peer", peer="vllm"),
    # SMG (PyPI `smg`, the SGLang model gateway) from its own venv (`make peers-smg`),
    # its defaults otherwise
    Policy("smg-cache-aware", "peer", peer="smg", note="smg 1.13.0, defaults"),
    Policy("smg-least-load", "peer", peer="smg", peer_policy="least_load"),
    Policy("smg-prefix-hash", "peer", peer="smg", peer_policy="prefix_hash"),
)}

# The comparison, in table order.
DEFAULT_POLICIES = ("random", "round-robin", "least-request", "gpu-usage", "least-latency",
                    "prefix-cache+least-request", "kvcache-aware+least-request", "best",
                    GREEDY, "sglang-cache-aware", "vllm-router-cache-aware")
# issue 15's first comparison on the hard workloads (hard_runner.py)
HARD_POLICIES = ("random", "least-request", "prefix-cache+least-request",
                 "kvcache-aware+least-request", "sglang-cache-aware", "smg-cache-aware",
                 "vllm-router-cache-aware")
SWEEP_POLICIES = ("random", "kvcache-aware+least-request", "best", GREEDY)


def get(name: str) -> Policy:
    """A policy by name; "NAME@N" is NAME with N router replicas behind haproxy, "NAME:wN"
    (after any "@N") NAME with N granian workers per router (pod-state hub as configured)."""
    head, wsep, workers = name.partition(":w")
    if wsep:
        pol = get(head)
        if not workers.isdigit() or int(workers) < 1 or pol.kind != "router":
            raise ValueError(f"{name!r}: NAME:wN wants a router policy and N >= 1")
        return replace(pol, name=name, router_args=(*pol.router_args, f"--workers={int(workers)}"))
    base, sep, n = name.partition("@")
    try:
        pol = POLICIES[ALIASES.get(base, base)]
    except KeyError:
        raise ValueError(f"unknown policy {base!r}; known: {', '.join(POLICIES)}") from None
    if not sep:
        return pol
    if not n.isdigit() or int(n) < 1 or pol.kind != "router":
        raise ValueError(f"{name!r}: NAME@N wants a router policy and N >= 1")
    return replace(pol, name=name, replicas=int(n))
