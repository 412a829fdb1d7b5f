"""Shared insert records named by their index (scheduling/insert_scopes.py): the PD
pairer's sides send scoped records, InsertTargets puts each into the right index; and the
hub counts records without decoding them (podstate/hub_metrics.py)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from kthena_router._core import BlockHashes
from kthena_router.metrics import RouterMetrics
from kthena_router.pd.pairing import PdPairer
from kthena_router.podstate import wire
from kthena_router.podstate.hub_metrics import count_records
from kthena_router.scheduling.insert_scopes import PD_DECODE, PD_PREFILL, InsertTargets, scoped, split
from kthena_router.scheduling.config import load_router_configuration_bytes
from kthena_router.scheduling.request import RequestInfo
from kthena_router.shared_index.sync import decode, encode

from test_scheduling_scheduler import endpoints


def test_scoped_keys_round_trip_and_plain_keys_are_unchanged() -> None:
    got: list[tuple[str, bytes]] = []
    scoped(PD_PREFILL, lambda k, h: got.append((k, h.to_bytes())))("10.0.0.1:8000", BlockHashes([1, 2]))
    scoped("", lambda k, h: got.append((k, h.to_bytes())))("10.0.0.1:8000", BlockHashes([3]))
    assert [split(k) for k, _ in got] == [(PD_PREFILL, "10.0.0.1:8000"), ("", "10.0.0.1:8000")]
    # the Redis records carry them as they are (u8 length: short enough)
    assert decode(encode([(k, h) for k, h in got])) == got


class _State:
    def __init__(self, pd: dict) -> None:  # type: ignore[type-arg]
        self.pd = pd


def _pairer() -> tuple[PdPairer, tuple, tuple]:  # type: ignore[type-arg]
    from kthena_router.pd.topology import PdGroup, PdTopology

    pre, dec = endpoints(2), tuple(endpoints(4)[2:])
    topo = PdTopology(("default", "pd"), "http", {"a": PdGroup("a", pre, dec)}, dec,
                      group_of={ep.key: "a" for ep in pre + dec})
    p = PdPairer(metrics=RouterMetrics(CollectorRegistry()))
    p.on_state(_State({("default", "pd"): topo}))
    return p, pre, dec


def test_pd_sides_send_scoped_records_and_targets_apply_them_to_the_right_side() -> None:
    p, pre, dec = _pairer()
    sent: list[tuple[str, BlockHashes]] = []
    p.set_insert_listener("test", lambda k, h: sent.append((k, h)))
    body = {"model": "demo", "messages": [{"role": "user", "content": "a prompt long enough for blocks " * 20}]}
    info = RequestInfo("r1", "/v1/chat/completions", body, "demo", "", "demo")
    p.dispatched(pre[1], info, "prefill")
    p.dispatched(dec[0], info, "decode")
    assert [split(k) for k, _ in sent] == [(PD_PREFILL, pre[1].key), (PD_DECODE, dec[0].key)]

    # another worker's pairer learns them: each into its own side, nothing into the other
    q, _, _ = _pairer()
    targets = InsertTargets(lambda: None, lambda: q)
    assert all(targets.insert(k, h) for k, h in sent)
    pre_id = q.prefill.inner.endpoint_id(pre[1].key)
    assert q.prefill.inner.index.endpoint_len(pre_id) > 0
    assert q.decode.inner.index.endpoint_len(q.decode.inner.endpoint_id(dec[0].key)) > 0
    assert q.decode.inner.endpoint_id(pre[1].key) is None  # a prefill endpoint is no decode one
    assert not targets.insert(pre[1].key, sent[0][1])  # unscoped: the plain scheduler (none here)
    assert not targets.insert("other-scope\x00" + pre[1].key, sent[0][1])  # an unknown scope is skipped

    # a reload that builds new side schedulers keeps the listener; None stops it
    old = p.prefill.inner
    p.configure(load_router_configuration_bytes(b"pd: {prefill: {plugins: {Score: {enabled: "
                                                b"[{name: prefix-cache, weight: 3}]}}}}").pd)
    assert p.prefill.inner is not old
    p.dispatched(pre[0], RequestInfo("r2", "/v1/chat/completions", body, "demo", "", "demo"), "prefill")
    assert split(sent[-1][0]) == (PD_PREFILL, pre[0].key) and len(sent) == 3
    p.set_insert_listener("test", None)
    p.dispatched(pre[0], info, "prefill")
    assert len(sent) == 3


def test_hub_counts_insert_records_from_their_headers() -> None:
    payload = (wire.encode_insert("10.0.0.1:8000", BlockHashes([1, 2, 3]).to_bytes())
               + wire.encode_insert("pd-prefill\x00[::1]:9", b""))
    assert count_records(payload) == 2
    assert count_records(payload[:-1]) == 1  # a truncated record is not counted
    assert count_records(b"") == 0
