"""Local tokenization for `kvcache-aware`: Hugging Face tokenizers loaded once per model,
with a prompt-prefix cache so that a long shared prefix is not tokenized again.

Configuration: kvcache-aware's ``tokenizers`` argument maps a served model name to its
``tokenizer.json`` (our extension; Kthena instead calls the engine's /tokenize per request).
Models without an entry get no local tokenization (the caller falls back to prefix-cache).

Special tokens follow the engine: ``encode(text, add_special_tokens)`` equals
``Tokenizer.encode(text, add_special_tokens=...)``. vLLM adds them (BOS) for completions and
not for chat, whose template already writes BOS; a request's own ``add_special_tokens``
overrides that (``engine_adds_special_tokens``). Truncation and padding configured in
tokenizer.json are switched off: the engine tokenizes the whole prompt.

Prefix cache. The text is cut into chunks of ``chunk_chars`` characters; chunk k's entry is
keyed by (its parent entry, the chunk's text), so a lookup walks the chain of a prompt's
full chunks and stops at the first miss (dict lookups compare the text: no false hits).
An entry holds a cut position c_k at least ``margin`` characters before the chunk's end,
at the start of a pre-tokenizer word, and the token ids between c_{k-1} and c_k. On a hit
up to chunk k, the ids up to c_k are reused and the text is tokenized again from the start
of the word before c_k (the anchor, which absorbs a prefix space a tokenizer may prepend
to the first word), keeping the tokens from c_k on.

Why that equals tokenizing the whole text: BPE/Unigram/WordPiece models work word by word,
and a regex pre-tokenizer's words up to c_k depend only on the text up to c_k plus a
lookahead of a few characters, which ``margin`` (>= the longest added token + 8 chars,
so that a special token cannot straddle the cut either) covers. This holds for the common
ByteLevel (GPT-2, Llama-3, Qwen) and Metaspace (Llama-2, Mistral) pipelines and is checked
by property tests; every resumption is also checked (a token must start exactly at c_k),
and a failed check falls back to tokenizing the whole text. A tokenizer whose normalizer
rewrites text across more than ``margin`` characters could in theory differ; the cost would
be a few mismatched blocks in cache matching, never a wrong response.

Threading: the cache is guarded by a lock held only for dict work, not while encoding (the
tokenizer releases the GIL, so long prompts may be encoded in a thread).
"""

from __future__ import annotations

import itertools
import logging
import threading
from array import array
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import Encoding, Tokenizer

__all__ = ["CachedTokenizer", "TokenizerRegistry", "TokenizerUnavailable", "engine_adds_special_tokens"]

log = logging.getLogger(__name__)

DEFAULT_CHUNK_CHARS = 4096
DEFAULT_CACHE_TOKENS = 2_000_000
_MIN_MARGIN = 16


class TokenizerUnavailable(Exception):
    """The model's tokenizer.json could not be loaded."""


def engine_adds_special_tokens(body: Mapping[str, Any], chat: bool) -> bool:
    """vLLM's decision: the request's ``add_special_tokens`` if a boolean, else True for
    completions and False for chat (the chat template writes BOS itself)."""
    v = body.get("add_special_tokens")
    return v if isinstance(v, bool) else not chat


@dataclass(frozen=True, slots=True)
class _Entry:
    id: int
    cut: int  # characters before `cut` are covered by the chain's ids
    anchor: int  # start of the word before `cut`: where re-tokenization resumes
    ids: array  # token ids between the parent's cut and this cut


_ROOT = _Entry(0, 0, 0, array("I"))


@dataclass(slots=True)
class CacheStats:
    lookups: int = 0
    chunk_hits: int = 0  # chunks whose tokens were reused
    resync_failures: int = 0  # resumptions that failed the check (whole text re-tokenized)
    entries: int = 0
    cached_tokens: int = 0


class CachedTokenizer:
    """One model's tokenizer with its prompt-prefix cache."""

    def __init__(self, tokenizer: Tokenizer, *, chunk_chars: int = DEFAULT_CHUNK_CHARS,
                 cache_tokens: int = DEFAULT_CACHE_TOKENS) -> None:
        if chunk_chars <= 0:
            raise ValueError("chunk_chars must be positive")
        tokenizer.no_truncation()
        tokenizer.no_padding()
        self.tokenizer = tokenizer
        self.chunk_chars = chunk_chars
        self.cache_tokens = cache_tokens
        added = tokenizer.get_added_tokens_decoder().values()
        longest_special = max((len(t.content) for t in added), default=0)
        self.margin = max(_MIN_MARGIN, longest_special + 8)
        self._head, self._tail = self._special_frame()
        self._entries: OrderedDict[tuple[int, str], _Entry] = OrderedDict()
        self._ids = itertools.count(1)  # next() is atomic under the GIL
        self._lock = threading.Lock()
        self.stats = CacheStats()

    def _special_frame(self) -> tuple[array | None, array | None]:
        """Ids the post-processor puts around the text (e.g. BOS), if it only frames it."""
        probe = "frame probe 123"
        body = self.tokenizer.encode(probe, add_special_tokens=False).ids
        full = self.tokenizer.encode(probe, add_special_tokens=True).ids
        for i in range(len(full) - len(body) + 1):
            if full[i:i + len(body)] == body:
                return array("I", full[:i]), array("I", full[i + len(body):])
        return None, None  # the post-processor rewrites the text: no cache with specials

    # ------------------------------------------------------------------ public

    def encode(self, text: str, add_special_tokens: bool) -> array:
        """Token ids of `text` (array of u32, native order), as
        ``Tokenizer.encode(text, add_special_tokens=...)`` gives them."""
        if add_special_tokens:
            if self._head is None or self._tail is None:
                return array("I", self.tokenizer.encode(text, add_special_tokens=True).ids)
            out = array("I", self._head)
            out += self._encode_body(text)
            out += self._tail
            return out
        return self._encode_body(text)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.stats.entries = self.stats.cached_tokens = 0

    # ------------------------------------------------------------------ internals

    def _lookup(self, text: str, n_chunks: int) -> list[_Entry]:
        size = self.chunk_chars
        hits: list[_Entry] = []
        parent = 0
        with self._lock:
            self.stats.lookups += 1
            for k in range(n_chunks):
                key = (parent, text[k * size:(k + 1) * size])
                e = self._entries.get(key)
                if e is None:
                    break
                self._entries.move_to_end(key)
                hits.append(e)
                parent = e.id
            self.stats.chunk_hits += len(hits)
        return hits

    def _encode_body(self, text: str) -> array:
        n_chunks = len(text) // self.chunk_chars
        if n_chunks == 0:
            return array("I", self.tokenizer.encode(text, add_special_tokens=False).ids)
        hits = self._lookup(text, n_chunks)
        last = hits[-1] if hits else _ROOT
        enc = self.tokenizer.encode(text[last.anchor:], add_special_tokens=False)
        start = self._resume_index(enc, last.cut - last.anchor)
        if start is None:
            with self._lock:
                self.stats.resync_failures += 1
            hits, last = [], _ROOT
            enc = self.tokenizer.encode(text, add_special_tokens=False)
            start = 0
        out = array("I")
        for e in hits:
            out += e.ids
        ids = enc.ids
        out.extend(ids[start:] if start else ids)
        if len(hits) < n_chunks:
            self._insert(text, hits, last, enc, ids, start, n_chunks)
        return out

    @staticmethod
    def _resume_index(enc: Encoding, rel_cut: int) -> int | None:
        if rel_cut == 0:
            return 0
        i = enc.char_to_token(rel_cut)
        if i is None or enc.token_to_chars(i)[0] != rel_cut:
            return None
        return i

    def _insert(self, text: str, hits: list[_Entry], last: _Entry, enc: Encoding, ids: list[int],
                start: int, n_chunks: int) -> None:
        """Add entries for the chunks after the hits, from the encoding of text[last.anchor:]."""
        base = last.anchor
        prev_cut, prev_tok = last.cut, start
        new: list[tuple[tuple[int, str], _Entry]] = []
        parent = last.id
        size = self.chunk_chars
        for k in range(len(hits), n_chunks):
            rel = (k + 1) * size - self.margin - base
            if rel <= 0:
                break
            w = enc.char_to_word(rel)
            if w is None or w < 1:
                break
            cut_tok = enc.word_to_tokens(w)
            anchor_tok = enc.word_to_tokens(w - 1)
            if cut_tok is None or anchor_tok is None:
                break
            cut = enc.token_to_chars(cut_tok[0])[0] + base
            anchor = enc.token_to_chars(anchor_tok[0])[0] + base
            if cut <= prev_cut or anchor < 0:
                break  # one word spans the whole chunk: nothing safe to cache here
            entry_id = next(self._ids)
            entry = _Entry(entry_id, cut, anchor, array("I", ids[prev_tok:cut_tok[0]]))
            new.append(((parent, text[k * size:(k + 1) * size]), entry))
            parent, prev_cut, prev_tok = entry_id, cut, cut_tok[0]
        if not new:
            return
        with self._lock:
            for key, entry in new:
                old = self._entries.pop(key, None)
                if old is not None:
                    self.stats.cached_tokens -= len(old.ids)
                self._entries[key] = entry
                self.stats.cached_tokens += len(entry.ids)
            while self.stats.cached_tokens > self.cache_tokens and self._entries:
                _, dropped = self._entries.popitem(last=False)
                self.stats.cached_tokens -= len(dropped.ids)
            self.stats.entries = len(self._entries)


class TokenizerRegistry:
    """model name -> CachedTokenizer, each tokenizer.json loaded once (models sharing a
    file share one tokenizer and cache). A load failure is remembered, not retried per
    request; build a new registry on config reload."""

    def __init__(self, paths: Mapping[str, str], *, chunk_chars: int = DEFAULT_CHUNK_CHARS,
                 cache_tokens: int = DEFAULT_CACHE_TOKENS) -> None:
        self._paths = {m: str(Path(p)) for m, p in paths.items()}
        self._chunk_chars = chunk_chars
        self._cache_tokens = cache_tokens
        self._by_path: dict[str, CachedTokenizer | TokenizerUnavailable] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_args(cls, args: Any) -> TokenizerRegistry:
        """From config.KvCacheAwareArgs."""
        return cls(args.tokenizers, chunk_chars=args.tokenizer_chunk_chars, cache_tokens=args.tokenizer_cache_tokens)

    def models(self) -> list[str]:
        return sorted(self._paths)

    def get(self, model: str) -> CachedTokenizer | None:
        """The model's tokenizer, loading it on first use; None if the model has none
        configured. Raises TokenizerUnavailable if its file cannot be loaded."""
        path = self._paths.get(model)
        if path is None:
            return None
        got = self._by_path.get(path)
        if got is None:
            with self._lock:
                got = self._by_path.get(path)
                if got is None:
                    got = self._load(path)
                    self._by_path[path] = got
        if isinstance(got, TokenizerUnavailable):
            raise got
        return got

    def load_all(self) -> list[str]:
        """Load every configured tokenizer now (at startup); returns the error messages."""
        errors = []
        for model in self.models():
            try:
                self.get(model)
            except TokenizerUnavailable as e:
                errors.append(f"{model}: {e}")
        return errors

    def _load(self, path: str) -> CachedTokenizer | TokenizerUnavailable:
        try:
            tok = Tokenizer.from_file(path)
        except Exception as e:  # tokenizers raises plain Exception for bad files
            log.warning("cannot load tokenizer %s: %s", path, e)
            return TokenizerUnavailable(f"cannot load tokenizer {path}: {e}")
        return CachedTokenizer(tok, chunk_chars=self._chunk_chars, cache_tokens=self._cache_tokens)
