"""Dispatch-time inserts leaving and entering a worker (docs/pod-state.md, "Insert relay
cost"): the pod-state link queueing one insert for the hub and applying a frame of other
workers' inserts, and the shared prefix index encoding a round's dispatches for Redis and
merging another replica's entry. Chains of 64 and 1024 blocks (4 KiB and 64 KiB prompts
at the default 64 bytes a block). The receiving benchmarks include the PrefixIndex inserts
themselves. Run with --benchmark-only."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from kthena_router._core import BlockHashes, PrefixIndex, prefix_hashes
from kthena_router.podstate import wire
from kthena_router.podstate.client import PodStateClient
from kthena_router.podstate.link import PodStateLink
from kthena_router.scheduling.insert_scopes import InsertTargets
from kthena_router.shared_index.config import SharedIndexSettings
from kthena_router.shared_index.sync import SharedIndexMetrics, SharedIndexSync, encode

BLOCKS = {"64blk": 64, "1024blk": 1024}
BS = 64
RECORDS = 8  # inserts in one pod-state frame / one shared-index entry
KEYS = [f"10.0.0.{i}:8000" for i in range(RECORDS)]


def _chains(blocks: int) -> list[BlockHashes]:
    return [prefix_hashes(f"tenant {i} ".encode() * (blocks * BS // 9 + 1), BS, 7, blocks) for i in range(RECORDS)]


def _target() -> Any:
    ids = {k: i for i, k in enumerate(KEYS)}
    return SimpleNamespace(index=PrefixIndex(1 << 20), endpoint_id=ids.get)


@pytest.mark.parametrize("blocks", list(BLOCKS.values()), ids=list(BLOCKS))
def test_bench_pod_state_send_insert(benchmark, blocks):
    link = PodStateLink.__new__(PodStateLink)  # only its client is used on this path
    link.client = PodStateClient("unused", on_snapshot=print, on_probes=print, on_inserts=print, on_mode=print)
    link.client.connected, link.client._writer, link.client._flush_scheduled = True, object(), True
    hashes = _chains(blocks)[0]

    def send() -> None:
        link.client._buf = bytearray()
        link._send_insert(KEYS[0], hashes)

    benchmark(send)
    assert len(link.client._buf) == 2 + len(KEYS[0]) + 4 + 8 * blocks


@pytest.mark.parametrize("blocks", list(BLOCKS.values()), ids=list(BLOCKS))
def test_bench_pod_state_apply_inserts(benchmark, blocks):
    """One INSERTS frame of RECORDS inserts from other workers, into this worker's index."""
    chains = _chains(blocks)
    payload = b"".join(wire.encode_insert(k, h.to_bytes()) for k, h in zip(KEYS, chains))
    link = PodStateLink.__new__(PodStateLink)
    link.inserts_applied = 0
    target = _target()
    link.targets = InsertTargets(lambda: target)
    benchmark(link._inserts, payload)
    assert target.index.endpoint_len(RECORDS - 1) == blocks


def _sync(target: Any) -> SharedIndexSync:
    # the real object (its Redis client connects only when used), with a pod id: the merge
    # then checks each entry's pod as a worker on the hub does
    return SharedIndexSync(SharedIndexSettings("127.0.0.1:1", ttl_s=3600.0), InsertTargets(lambda: target),
                           SharedIndexMetrics(CollectorRegistry()), b"this-pod", lambda: True)


@pytest.mark.parametrize("blocks", list(BLOCKS.values()), ids=list(BLOCKS))
def test_bench_shared_index_publish(benchmark, blocks):
    """A round's dispatches (RECORDS distinct chains) taken from the buffer and encoded."""
    sync, chains = _sync(None), _chains(blocks)

    def publish() -> bytes:
        sync.pending.extend(zip(KEYS, chains))
        return encode(sync._take())

    blob = benchmark(publish)
    assert len(blob) == sum(1 + len(k) + 4 for k in KEYS) + RECORDS * 8 * blocks


@pytest.mark.parametrize("blocks", list(BLOCKS.values()), ids=list(BLOCKS))
def test_bench_shared_index_merge(benchmark, blocks):
    """Another replica's entry of RECORDS records, merged into this worker's index."""
    target, chains = _target(), _chains(blocks)
    sync = _sync(target)
    sync.pending.extend(zip(KEYS, chains))
    entry = (f"{int(time.time() * 1000)}-0".encode(), {b"r": b"other", b"p": b"other-pod", b"d": encode(sync._take())})
    benchmark(sync._merge, [entry], int(time.time() * 1000))
    assert target.index.endpoint_len(RECORDS - 1) == blocks
