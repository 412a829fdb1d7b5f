"""What the scheduler needs to know about one request (built by the proxy, once).

The prompt is rendered lazily: only a pipeline with a prefix plugin pays for it, and only
once per request (retries reuse the hashes kept here).
"""

from __future__ import annotations

from typing import Any

from .render import render_request

_UNSET: Any = object()
CHAT_PATH = "/v1/chat/completions"
PROMPT_PATHS = frozenset((CHAT_PATH, "/v1/completions"))


class RequestInfo:
    __slots__ = ("request_id", "path", "obj", "model", "lora", "model_label", "hashes", "hash_tag", "prompt_bytes",
                 "tokens", "tokens_ready", "key_tag", "prefix_key", "matched", "pending", "_rendered")

    def __init__(self, request_id: str, path: str, obj: Any, model: str, lora: str, model_label: str) -> None:
        self.request_id = request_id
        self.path = path
        self.obj = obj  # the parsed body (dict)
        self.model = model  # ModelServer.model: the engine's base model (prefix-index key)
        self.lora = lora  # adapter name, "" for the base model
        self.model_label = model_label  # the client's model name (metrics label)
        self.hashes: Any = None  # _core.BlockHashes of the prompt, set by the scheduler
        # (block size, max blocks, seed) `hashes` were computed with: a second scheduler with
        # the same prefix args (PD: decode and prefill sides) reuses them
        self.hash_tag: tuple[int, int, int] | None = None
        self.prompt_bytes = 0  # length of the hashed prompt, set with `hashes`
        self.tokens: Any = None  # token ids, when tokenized ahead (off the event loop)
        self.tokens_ready = False
        # prefix-hash-bounded's key and the (block size, blocks, seed) it was computed with
        self.key_tag: tuple[int, int, int] | None = None
        self.prefix_key: int | None = None
        # prefill-cost: (scheduler, {endpoint id: matched blocks}, total blocks) of the last
        # decision, so that the dispatch can tell the chosen engine's uncached blocks
        self.matched: tuple[Any, dict[int, int], int] | None = None
        # prefill-cost: (scheduler, its scorers, endpoint id, uncached blocks) of the attempt's
        # prefill work, counted as pending there until `prefilled`
        self.pending: tuple[Any, Any, int, float] | None = None
        self._rendered: Any = _UNSET  # prompt(), rendered once (prefix-cache and the key share it)

    def prefilled(self) -> None:
        """The attempt's first token arrived (or it ended): its prefill work is done."""
        p = self.pending
        if p is not None:
            self.pending = None
            _, scorers, ep_id, blocks = p
            for scorer in scorers:
                scorer.add_pending(ep_id, -blocks)

    def prompt_chars(self) -> int:
        """A cheap size estimate of the prompt text (decides whether tokenizing may block)."""
        obj = self.obj
        if type(obj) is not dict:
            return 0
        if self.path == CHAT_PATH:
            msgs = obj.get("messages")
            if not isinstance(msgs, list):
                return 0
            n = 0
            for m in msgs:
                c = m.get("content") if isinstance(m, dict) else None
                if isinstance(c, str):
                    n += len(c)
                elif isinstance(c, list):
                    n += sum(len(p.get("text") or "") for p in c if isinstance(p, dict) and isinstance(p.get("text"), str))
            return n
        prompt = obj.get("prompt")
        return len(prompt) if isinstance(prompt, str) else 0

    def prompt(self) -> bytes | None:
        """Canonical prompt bytes, or None when the request has no prompt we understand
        (other paths, malformed messages: the engine answers those; we just do not match)."""
        if self._rendered is not _UNSET:
            return self._rendered  # type: ignore[no-any-return]
        rendered: bytes | None = None
        if self.path in PROMPT_PATHS and type(self.obj) is dict:
            try:
                rendered = render_request(self.obj, self.path == CHAT_PATH)
            except (ValueError, TypeError, AttributeError, RecursionError):  # nesting beyond what we render
                rendered = None
        self._rendered = rendered
        return rendered
