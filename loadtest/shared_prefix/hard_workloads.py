"""The hard workloads of issue 15: skew, multi-turn sessions, mixed lengths, bursts, LoRA.

Each profile is a seeded generator of a `Plan`: sessions of requests (a one-turn session
per request for open-loop workloads), their start times (Poisson, simulated seconds) and,
for multi-turn chat, the think time before each later turn (closed loop: a turn is sent
only after the previous reply has ended plus the think time; client.drive_sessions).
Texts use workload.words_text (one token per word for the simulator's tokenizer), so
prompt lengths in tokens are known without tokenizing.

Scale: 3 engines of the calibrated H200 / Llama-3-8B simulator. Rough per-engine costs
(cost_model): a 128-token prefill on a cached 4k prefix ~13 ms, a cold 4k prefill ~100 ms,
32k ~1.2 s, a decode step at batch 64 ~12 ms. Rates below are stated against those
figures; `time_scale` (wall s per simulated s) is what keeps 2 shared cores on schedule.
Everything is a function of the seed.
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from .workload import words_text

Message = tuple[str, str]  # (role, content)


@dataclass(frozen=True)
class HardRequest:
    index: int  # position in generation order (sessions in start order, turns in order)
    group: int  # prefix group / session / document / adapter task: for per-group stats
    kind: str  # zipf | turn | chat | rag | long | burst | lora
    messages: tuple[Message, ...]
    prompt_tokens: int  # content tokens (the chat template adds a few)
    max_tokens: int
    model: str | None = None  # a LoRA adapter's name; None: the cluster's base model
    session: int = -1
    turn: int = 0

    def chat_body(self, model: str) -> dict[str, Any]:
        return {"model": self.model or model,
                "messages": [{"role": r, "content": c} for r, c in self.messages],
                "stream": True, "max_tokens": self.max_tokens}


@dataclass
class Plan:
    sessions: list[list[HardRequest]]
    starts: list[float]  # simulated seconds, one per session
    thinks: list[list[float]]  # think time before each turn (0 for the first)

    @property
    def requests(self) -> list[HardRequest]:
        return [r for s in self.sessions for r in s]


@dataclass(frozen=True)
class HardSpec:
    """Common settings; subclasses generate the traffic."""
    name: str = ""
    seed: int = 1
    time_scale: float = 6.0  # wall seconds per simulated second on this 2-core machine
    kv_blocks: int = 4096  # per engine, block size 16
    max_concurrency: int = 256  # client-side cap (high: queues build in the engines)
    engine_args: tuple[str, ...] = ()  # extra simulator CLI arguments
    lora_adapters: tuple[str, ...] = ()  # listed on the ModelRoute (loraAdapters)

    def plan(self) -> Plan:
        raise NotImplementedError

    def to_json(self) -> dict[str, Any]:
        return {"kind": type(self).__name__, **asdict(self)}


def zipf_weights(n: int, s: float) -> list[float]:
    """Normalised Zipf(s) popularity of ranks 1..n."""
    w = [1.0 / (k ** s) for k in range(1, n + 1)]
    total = sum(w)
    return [x / total for x in w]


def poisson_starts(rng: random.Random, n: int, rate: float) -> list[float]:
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate)
    return out


def _open_loop(reqs: list[HardRequest], starts: list[float]) -> Plan:
    return Plan([[r] for r in reqs], starts, [[0.0] for _ in reqs])


def _sys_user(system: str, question: str) -> tuple[Message, ...]:
    return (("system", system), ("user", question))


@dataclass(frozen=True)
class ZipfSpec(HardSpec):
    """Shared-prefix groups with Zipf(s) popularity. 12 groups at s = 1.1: the hottest
    takes 35% of requests, the two hottest 52%. The cluster serves ~140-150 req/s with
    every prefix cached (measured, docs/hard-workloads-goodput.md); at 125 req/s the
    hottest group needs ~0.95 of an engine and the two hottest ~1.4: they must be
    replicated; the 10 cold ones (48% of the traffic, 41k prefix tokens) should stay
    partitioned (KV per engine: 2560 blocks = 41k tokens). 960 requests (~7.7 s) so that
    the steady state, not the cold start, decides the tail."""
    num_groups: int = 12
    zipf_s: float = 1.1
    num_requests: int = 960
    system_len: int = 4096
    question_len: int = 128
    output_len: int = 64
    rate: float = 125.0
    kv_blocks: int = 2560

    def plan(self) -> Plan:
        rng = random.Random(self.seed)
        systems = [words_text(rng, self.system_len) for _ in range(self.num_groups)]
        groups = rng.choices(range(self.num_groups),
                             zipf_weights(self.num_groups, self.zipf_s), k=self.num_requests)
        reqs = [HardRequest(i, g, "zipf", _sys_user(systems[g], words_text(rng, self.question_len)),
                            self.system_len + self.question_len, self.output_len)
                for i, g in enumerate(groups)]
        return _open_loop(reqs, poisson_starts(random.Random(self.seed * 7919 + 1),
                                               len(reqs), self.rate))


@dataclass(frozen=True)
class MultiTurnSpec(HardSpec):
    """Chat sessions of 2-10 turns: turn k's prompt = turn k-1's messages + its reply +
    a new question (users paste 200-2000 tokens), replies of 32-256 tokens, think times
    Exp(mean 0.5 s: compressed, real users take tens of seconds), contexts capped at 16k
    tokens (a session ends early rather than exceed it). 48 sessions open at 12/s; each
    starts from one of 8 shared system prompts.
    The reply re-sent in the next turn is the workload's own text of max_tokens words,
    not the engine's output (so the plan is fixed in advance): the cached prefix of a
    turn is its previous prompt, not the previous reply. ~290 turns, mean prompt ~5.6k
    tokens, ~30 req/s at the peak: without session affinity a turn re-prefills its whole
    context (~150 ms at 6k), which 3 engines cannot sustain; with it, ~1.2k new tokens a
    turn. KV per engine: 8192 blocks (131k tokens, ~16 live sessions of ~8k)."""
    num_sessions: int = 48
    min_turns: int = 2
    max_turns: int = 10
    system_len: int = 512
    num_systems: int = 8
    question_len: tuple[int, int] = (200, 2000)
    reply_len: tuple[int, int] = (32, 256)
    max_context: int = 16384
    think_mean_s: float = 0.5
    session_rate: float = 12.0
    time_scale: float = 4.0
    kv_blocks: int = 8192

    def plan(self) -> Plan:
        rng = random.Random(self.seed)
        systems = [words_text(rng, self.system_len) for _ in range(self.num_systems)]
        sessions: list[list[HardRequest]] = []
        thinks: list[list[float]] = []
        index = 0
        for s in range(self.num_sessions):
            n_turns = rng.randint(self.min_turns, self.max_turns)
            msgs: tuple[Message, ...] = (("system", systems[rng.randrange(self.num_systems)]),)
            ctx = self.system_len
            turns: list[HardRequest] = []
            waits: list[float] = []
            for t in range(n_turns):
                q_len = rng.randint(*self.question_len)
                out = rng.randint(*self.reply_len)
                if ctx + q_len + out > self.max_context:
                    break
                msgs = msgs + (("user", words_text(rng, q_len)),)
                ctx += q_len
                turns.append(HardRequest(index, s, "turn", msgs, ctx, out, session=s, turn=t))
                waits.append(0.0 if t == 0 else rng.expovariate(1.0 / self.think_mean_s))
                index += 1
                msgs = msgs + (("assistant", words_text(rng, out)),)
                ctx += out
            sessions.append(turns)
            thinks.append(waits)
        starts = poisson_starts(random.Random(self.seed * 7919 + 1), len(sessions),
                                self.session_rate)
        return Plan(sessions, starts, thinks)


def log_uniform_int(rng: random.Random, lo: int, hi: int) -> int:
    return min(hi, int(math.exp(rng.uniform(math.log(lo), math.log(hi + 1)))))


@dataclass(frozen=True)
class MixedSpec(HardSpec):
    """60% short chat (200-800 unique tokens), 30% RAG (one of 50 shared documents of
    4-8k tokens, uniform, + a 50-200-token question), 10% long context (32k unique
    tokens); outputs log-uniform in 16-1024 (mean 242). Prefill alone averages ~0.25 s of
    engine time per request (a 32k prompt ~1.9 s in 8k chunks, a cold document ~0.16 s),
    so 3 engines would serve at most ~10 req/s before decode; with decode and the 32k
    prompts' attention they served ~4 req/s when offered 6 (docs/hard-workloads.md); sent
    at 3.2 req/s (~0.8 of that). KV per engine: 6144 blocks (98k tokens: ~16 documents or
    3 long prompts)."""
    num_requests: int = 96
    mix: tuple[float, float, float] = (0.6, 0.3, 0.1)  # chat, rag, long
    chat_len: tuple[int, int] = (200, 800)
    num_docs: int = 50
    doc_len: tuple[int, int] = (4000, 8000)
    rag_question_len: tuple[int, int] = (50, 200)
    long_len: int = 32768
    output_len: tuple[int, int] = (16, 1024)
    rate: float = 3.2
    time_scale: float = 4.0
    kv_blocks: int = 6144

    def plan(self) -> Plan:
        rng = random.Random(self.seed)
        doc_lens = [rng.randint(*self.doc_len) for _ in range(self.num_docs)]
        docs: dict[int, str] = {}  # generated on first use (the same for a seed)
        reqs: list[HardRequest] = []
        for i in range(self.num_requests):
            kind = rng.choices(("chat", "rag", "long"), self.mix)[0]
            out = log_uniform_int(rng, *self.output_len)
            if kind == "chat":
                n = rng.randint(*self.chat_len)
                msgs: tuple[Message, ...] = (("user", words_text(rng, n)),)
                group = -1
            elif kind == "rag":
                group = rng.randrange(self.num_docs)
                if group not in docs:
                    docs[group] = words_text(random.Random(self.seed * 1_000_003 + group),
                                             doc_lens[group])
                q = rng.randint(*self.rag_question_len)
                msgs = _sys_user(docs[group], words_text(rng, q))
                n = doc_lens[group] + q
            else:
                n, group = self.long_len, -2
                msgs = (("user", words_text(rng, n)),)
            reqs.append(HardRequest(i, group, kind, msgs, n, out))
        return _open_loop(reqs, poisson_starts(random.Random(self.seed * 7919 + 1),
                                               len(reqs), self.rate))


@dataclass(frozen=True)
class BurstSpec(HardSpec):
    """Uniform shared-prefix groups (32 x 2048-token prompts, 128-token questions, 64
    out) with the arrival rate stepping 0.5x -> 2x -> 0.5x of `capacity` (100 req/s:
    ~0.85 of the cluster's cached capacity), so that queues build during the burst and
    drain after it. Phases: 2 s, 1.5 s, 2.5 s (simulated). KV: 2560 blocks per engine
    (32 prefixes = 65k tokens, ~1.6 engines' worth)."""
    num_groups: int = 32
    system_len: int = 2048
    question_len: int = 128
    output_len: int = 64
    capacity: float = 100.0
    phases: tuple[tuple[float, float], ...] = ((2.0, 0.5), (1.5, 2.0), (2.5, 0.5))
    kv_blocks: int = 2560
    max_concurrency: int = 512

    def arrival_times(self, rng: random.Random) -> list[float]:
        """Piecewise Poisson: exponential gaps at the current phase's rate (memoryless,
        so restarting at a phase boundary keeps each phase Poisson)."""
        out: list[float] = []
        t0 = 0.0
        for dur, mult in self.phases:
            t = t0 + rng.expovariate(self.capacity * mult)
            while t < t0 + dur:
                out.append(t)
                t += rng.expovariate(self.capacity * mult)
            t0 += dur
        return out

    def plan(self) -> Plan:
        rng = random.Random(self.seed)
        starts = self.arrival_times(random.Random(self.seed * 7919 + 1))
        systems = [words_text(rng, self.system_len) for _ in range(self.num_groups)]
        reqs = []
        for i in range(len(starts)):
            g = rng.randrange(self.num_groups)
            reqs.append(HardRequest(i, g, "burst",
                                    _sys_user(systems[g], words_text(rng, self.question_len)),
                                    self.system_len + self.question_len, self.output_len))
        return _open_loop(reqs, starts)


LORA_NAMES = tuple(f"sim-lora-{i}" for i in range(8))
# Loading an adapter into a GPU slot: a rank-16 all-linear adapter of an 8B model is
# ~80 MB, a pinned host->GPU copy of a few ms plus vLLM's slot set-up; 20 ms is an
# assumption (not calibrated), stated in the docs.
LORA_LOAD_MS = 20.0


@dataclass(frozen=True)
class LoraSpec(HardSpec):
    """8 adapters on the base model, Zipf(1.2) adapter popularity (the hottest ~43%, the
    coldest ~3.5%), 3 task prompts (1024 tokens) per adapter, 256-token questions, 64 out,
    90 req/s (~0.8 of the cached capacity). Every engine registers all 8 adapters
    (--max-cpu-loras 8) but batches at most 4 (--max-loras 4, LRU GPU slots, LORA_LOAD_MS
    per load): a request whose adapter would be a 5th in the batch waits."""
    adapters: tuple[str, ...] = LORA_NAMES
    zipf_s: float = 1.2
    tasks_per_adapter: int = 3
    system_len: int = 1024
    question_len: int = 256
    output_len: int = 64
    num_requests: int = 450
    rate: float = 90.0
    kv_blocks: int = 2048
    lora_adapters: tuple[str, ...] = LORA_NAMES
    engine_args: tuple[str, ...] = field(default_factory=lambda: (
        "--max-loras", "4", "--max-cpu-loras", str(len(LORA_NAMES)),
        "--lora-load-ms", str(LORA_LOAD_MS), "--lora", *LORA_NAMES))

    def plan(self) -> Plan:
        rng = random.Random(self.seed)
        n_a = len(self.adapters)
        systems = [words_text(rng, self.system_len) for _ in range(n_a * self.tasks_per_adapter)]
        picks = rng.choices(range(n_a), zipf_weights(n_a, self.zipf_s), k=self.num_requests)
        reqs = []
        for i, a in enumerate(picks):
            g = a * self.tasks_per_adapter + rng.randrange(self.tasks_per_adapter)
            reqs.append(HardRequest(i, g, "lora",
                                    _sys_user(systems[g], words_text(rng, self.question_len)),
                                    self.system_len + self.question_len, self.output_len,
                                    model=self.adapters[a]))
        return _open_loop(reqs, poisson_starts(random.Random(self.seed * 7919 + 1),
                                               len(reqs), self.rate))


HARD_PROFILES: dict[str, HardSpec] = {
    "zipf": ZipfSpec(name="zipf"),
    "multiturn": MultiTurnSpec(name="multiturn"),
    "mixed": MixedSpec(name="mixed"),
    "bursts": BurstSpec(name="bursts"),
    "lora": LoraSpec(name="lora"),
}


def with_overrides(spec: HardSpec, items: list[str]) -> HardSpec:
    """`spec` with FIELD=VALUE overrides (runner's --set), each parsed as the field's
    current type (int, float, str); tuples and unknown fields are refused."""
    known = {f.name: getattr(spec, f.name) for f in fields(spec)}
    changes: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or key not in known or key in ("name", "seed"):
            raise ValueError(f"--set wants FIELD=VALUE with a field of {type(spec).__name__} "
                             f"other than name and seed, got {item!r}")
        cur = known[key]
        if not isinstance(cur, (int, float, str)) or isinstance(cur, bool):
            raise ValueError(f"--set cannot change {key} (a {type(cur).__name__})")
        try:
            changes[key] = type(cur)(raw)
        except ValueError:
            raise ValueError(f"--set {key} wants a {type(cur).__name__}, got {raw!r}") from None
    return replace(spec, **changes)
