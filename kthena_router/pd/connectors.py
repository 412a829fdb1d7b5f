"""What each KV connector puts on the wire: the two hops' bodies (docs/pd-dispatch.md).

The client's body is parsed once (proxy/body.py); every hop body is the original bytes
with a few top-level members spliced in, nothing else re-encoded.

- http, lmcache (Kthena's HTTP connector): the prefill hop is the request as a one-token,
  non-streamed completion; the decode hop is the original request (the decode engine loads
  the prompt's KV itself: LMCache, or by computing it again).
- nixl, mooncake (vLLM's kv_transfer_params relay): the prefill hop also carries
  `kv_transfer_params: {"do_remote_decode": true, "do_remote_prefill": false}`; its reply's
  `kv_transfer_params` go into the decode hop as they came. A reply without them (an engine
  with no KV connector) fails the prefill hop: the decode would compute the whole prompt again.
- bootstrap (SGLang): both hops carry bootstrap_host (the prefill endpoint's address),
  bootstrap_port (its bootstrap server) and bootstrap_room (random, 63 bits, new per pair)
  and are sent at once.
"""

from __future__ import annotations

import random
import orjson

from kthena_router.config.model import SGLANG_BOOTSTRAP
from kthena_router.endpoints.registry import EndpointState
from kthena_router.proxy.body import ParsedBody, model_replacement, splice

from .topology import bootstrap_port

__all__ = ["HopBodies", "KV_PARAMS_CONNECTORS", "NoKvParams"]

KV_PARAMS_CONNECTORS = frozenset(("nixl", "mooncake"))
_PREFILL_KV = (b"kv_transfer_params", b'{"do_remote_decode":true,"do_remote_prefill":false}')
_ONE = b"1"
_FALSE = b"false"
_NULL = b"null"
_rng = random.SystemRandom()


class NoKvParams(Exception):
    """A vLLM prefill reply without usable kv_transfer_params."""


class HopBodies:
    """The hop bodies of one request; built once, per pair only what changes."""

    __slots__ = ("body", "connector", "decode_reps", "_decode", "_prefill", "_prefill_reps")

    def __init__(self, body: ParsedBody, connector: str, upstream_model: str | None, inject_usage: bool) -> None:
        self.body = body
        self.connector = connector
        model = model_replacement(body, upstream_model)
        obj = body.obj
        decode = list(model)
        if inject_usage:  # the decode hop streams to the client: usage as on the one-hop path
            options = obj.get("stream_options") or {}
            decode.append((b"stream_options", orjson.dumps({**options, "include_usage": True})))
        self.decode_reps = decode
        prefill = list(model)
        if "stream" in obj:
            prefill.append((b"stream", _FALSE))
        if "stream_options" in obj:  # vLLM refuses stream_options without stream
            prefill.append((b"stream_options", _NULL))
        prefill.append((b"max_tokens", _ONE))
        if obj.get("max_completion_tokens") is not None:
            prefill.append((b"max_completion_tokens", _ONE))
        if connector in KV_PARAMS_CONNECTORS:
            prefill.append(_PREFILL_KV)
        self._prefill: bytes | None = None if connector == SGLANG_BOOTSTRAP else splice(body, prefill)
        self._prefill_reps = prefill
        self._decode: bytes | None = None

    @property
    def plain_decode(self) -> bytes:
        """The decode hop of http/lmcache pairs, and of a decode-only pair (built once, on first use)."""
        if self._decode is None:
            self._decode = splice(self.body, self.decode_reps)
        return self._decode

    @property
    def prefill(self) -> bytes:
        assert self._prefill is not None
        return self._prefill

    def decode_with_kv(self, reply: bytes) -> bytes:
        """nixl/mooncake: the decode hop carrying the prefill reply's kv_transfer_params."""
        try:
            obj = orjson.loads(reply)
        except orjson.JSONDecodeError:
            raise NoKvParams("the prefill reply is not JSON") from None
        kv = obj.get("kv_transfer_params") if type(obj) is dict else None
        if type(kv) is not dict or not kv:
            raise NoKvParams("the prefill reply has no kv_transfer_params (is the prefill engine started "
                             "with a KV connector, kv_role kv_producer or kv_both?)")
        return splice(self.body, [*self.decode_reps, (b"kv_transfer_params", orjson.dumps(kv))])

    def bootstrap(self, prefill_ep: EndpointState) -> tuple[bytes, bytes, int]:
        """SGLang: (prefill body, decode body, room) of one pair, a fresh room each time."""
        room = _rng.getrandbits(63)
        fields = [(b"bootstrap_host", orjson.dumps(prefill_ep.ip)),
                  (b"bootstrap_port", str(bootstrap_port(prefill_ep)).encode()),
                  (b"bootstrap_room", str(room).encode())]
        return (splice(self.body, [*self._prefill_reps, *fields]),
                splice(self.body, [*self.decode_reps, *fields]), room)

