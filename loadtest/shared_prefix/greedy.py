"""The greedy reference: a benchmark instrument (not a router plugin) that routes with
full knowledge of the engines' state, one request at a time.

The runner sends each request straight to the engine with the lowest predicted TTFT:

    TTFT(e) = queued prefill work on e (requests sent there without a first token yet,
              each costed by its uncached tokens) + this request's own prefill
              + the decode work that rides along in those prefill steps

using the simulator's calibration costs (loadtest/simulator/cost_model.py: the same
table the engines step with). What is cached where:
- true cache content, when the simulator has `GET /admin/engines/{i}/cache` (a list of
  cached block hashes, or {"block_hashes": [...]}): the request's prefix block hashes
  are computed with the simulator's own hash chain and matched block by block;
- until then (404), a model: an LRU of groups per engine, fed by what was sent where,
  holding as many prefixes as the engine's KV has room for beside its running
  sequences. The report says which of the two was used (`cache_source`).
Queues (waiting = sent without a first token, running = streaming) come from the
reference's own bookkeeping: every request is its own and it sees the instant each one
gets its first token, which is fresher than the admin state (polled every POLL_S, used
for each engine's true KV block count).

It is a one-step greedy choice, not a ceiling: it never trades this request's TTFT for
later ones (e.g. keeping a group on the engine that just evicted its prefix), so a
router can beat it (docs/benchmarks.md).
"""

from __future__ import annotations

import asyncio
import json
import math
import urllib.error
import urllib.request
from collections import OrderedDict
from dataclasses import dataclass, field

from loadtest.simulator.cost_model import CostModel
from loadtest.simulator.kvcache import hash_block, root_hash
from loadtest.simulator.tokenizer import load_codec, render_chat
from .client import Chooser
from .workload import Request

_HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback only
POLL_S = 0.25  # wall seconds between admin polls


@dataclass(frozen=True)
class PromptShape:
    prompt_len: int  # tokens of one rendered request
    shared_len: int  # tokens common to a group's requests (system prompt + template)


def prompt_shape(a: Request, b: Request) -> PromptShape:
    """Token counts from two requests of one group, with the simulator's tokenizer."""
    codec = load_codec()
    ta = codec.encode(render_chat(a.chat_body("m")["messages"]))
    tb = codec.encode(render_chat(b.chat_body("m")["messages"]))
    n = 0
    while n < min(len(ta), len(tb)) and ta[n] == tb[n]:
        n += 1
    return PromptShape(len(ta), n)


@dataclass
class _Engine:
    num_blocks: int
    pending: dict[int, float] = field(default_factory=dict)  # request index -> prefill ms
    pending_new_tokens: dict[int, int] = field(default_factory=dict)
    running: int = 0  # first token seen, not done (own bookkeeping)
    groups: OrderedDict[int, None] = field(default_factory=OrderedDict)  # LRU model
    true_hashes: set[int] | None = None  # from /cache when available


class GreedyReference(Chooser):
    def __init__(self, admin_url: str, n_engines: int, num_blocks: int, block_size: int,
                 shape: PromptShape, output_len: int, max_num_batched_tokens: int = 8192,
                 group_tokens: dict[int, list[int]] | None = None,
                 work_weight: float = 1.0) -> None:
        self.work_weight = work_weight
        self.admin = admin_url.rstrip("/")
        self.cost = CostModel.load()
        self.block_size = block_size
        self.shape = shape
        self.output_len = output_len
        self.budget = max_num_batched_tokens
        self.engines = [_Engine(num_blocks) for _ in range(n_engines)]
        self.group_tokens = group_tokens or {}
        self._group_hashes: dict[int, list[int]] = {}
        self.cache_source = "model"  # or "admin"
        self._task: asyncio.Task[None] | None = None
        self.polls = 0

    # --- the prediction ---------------------------------------------------------------
    def _cached_tokens(self, e: _Engine, group: int) -> int:
        full = self.shape.shared_len // self.block_size
        if e.true_hashes is not None and group in self.group_tokens:
            n = 0
            for h in self._hashes(group):
                if h not in e.true_hashes:
                    break
                n += 1
            return n * self.block_size
        return full * self.block_size if group in e.groups else 0

    def _hashes(self, group: int) -> list[int]:
        hs = self._group_hashes.get(group)
        if hs is None:
            toks, parent, hs = self.group_tokens[group], root_hash(None), []
            for i in range(self.shape.shared_len // self.block_size):
                parent = hash_block(parent, tuple(toks[i * self.block_size:(i + 1) * self.block_size]))
                hs.append(parent)
            self._group_hashes[group] = hs
        return hs

    def predict_ms(self, i: int, req: Request) -> float:
        e = self.engines[i]
        cached = self._cached_tokens(e, req.group)
        new = self.shape.prompt_len - cached
        own = self.cost.prefill_ms(new, cached)
        queued_tokens = sum(e.pending_new_tokens.values()) + new
        steps = max(1, math.ceil(queued_tokens / self.budget))
        ctx = self.shape.prompt_len + self.output_len / 2
        w = self.cost.decode_ms(1, 512)  # the floor each pass pays once (cost_model.py)
        ride = steps * max(0.0, self.cost.decode_ms(e.running, ctx) - w) if e.running else 0.0
        return sum(e.pending.values()) + own + ride

    # --- Chooser hooks ----------------------------------------------------------------
    def score(self, i: int, req: Request) -> float:
        """Predicted TTFT plus WORK_WEIGHT x this request's own prefill: a pure greedy
        TTFT choice spreads a group over idle engines (a miss there is still quicker than
        a queued hit), which costs every later request the re-prefill; the second term
        charges that cost (0 = plain lowest predicted TTFT)."""
        e = self.engines[i]
        cached = self._cached_tokens(e, req.group)
        own = self.cost.prefill_ms(self.shape.prompt_len - cached, cached)
        return self.predict_ms(i, req) + self.work_weight * own

    def choose(self, req: Request) -> int:
        best = min(range(len(self.engines)), key=lambda i: (self.score(i, req), i))
        e = self.engines[best]
        cached = self._cached_tokens(e, req.group)
        e.pending[req.index] = self.cost.prefill_ms(self.shape.prompt_len - cached, cached)
        e.pending_new_tokens[req.index] = self.shape.prompt_len - cached
        e.groups[req.group] = None
        e.groups.move_to_end(req.group)
        self._trim(e)
        return best

    def _trim(self, e: _Engine) -> None:
        # room for prefixes = KV minus what the running/queued sequences hold of their own
        own = (self.shape.prompt_len - self.shape.shared_len + self.output_len)
        busy = (e.running + len(e.pending)) * own
        room = max(0, e.num_blocks * self.block_size - busy)
        cap = max(1, room // max(1, self.shape.shared_len))
        while len(e.groups) > cap:
            e.groups.popitem(last=False)

    def on_first_token(self, req: Request, target: int) -> None:
        e = self.engines[target]
        if e.pending.pop(req.index, None) is not None:
            e.pending_new_tokens.pop(req.index, None)
            e.running += 1

    def on_done(self, req: Request, target: int) -> None:
        e = self.engines[target]
        if e.pending.pop(req.index, None) is not None:  # failed before its first token
            e.pending_new_tokens.pop(req.index, None)
        else:
            e.running = max(0, e.running - 1)

    # --- admin polling ----------------------------------------------------------------
    def _get(self, path: str) -> object | None:
        try:
            with _HTTP.open(self.admin + path, timeout=5) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError:
            return None

    def _poll_once(self) -> None:
        for i, e in enumerate(self.engines):
            st = self._get(f"/admin/engines/{i}/state")
            if isinstance(st, dict):
                e.num_blocks = sum(r.get("num_gpu_blocks", 0) for r in st.get("ranks", [])) or e.num_blocks
            if self.group_tokens:
                cache = self._get(f"/admin/engines/{i}/cache")
                hashes = cache.get("block_hashes") if isinstance(cache, dict) else cache
                if isinstance(hashes, list):
                    e.true_hashes = {int(h) for h in hashes}
                    self.cache_source = "admin"
        self.polls += 1

    async def _poll(self) -> None:
        while True:
            await asyncio.to_thread(self._poll_once)
            await asyncio.sleep(POLL_S)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._poll())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, OSError):
                pass
            self._task = None


def group_prompt_tokens(reqs: list[Request], shape: PromptShape) -> dict[int, list[int]]:
    """Shared-prefix token ids of each group (for matching true cached block hashes)."""
    codec = load_codec()
    out: dict[int, list[int]] = {}
    for r in reqs:
        if r.group not in out:
            out[r.group] = codec.encode(render_chat(r.chat_body("m")["messages"]))[: shape.shared_len]
    return out
