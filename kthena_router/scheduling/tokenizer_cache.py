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

Tails. The text after a prompt's last chunk entry (its *tail*, about a chunk at most) is
remembered per entry for the last ``_TAILS_PER_ENTRY`` prompts that ended there
(interleaved conversations over one system prompt): its text, token ids and checkpoints
every ``tail_step`` characters (a cut at a word start, its anchor and its token index,
found as above). A prompt compares its text after its last hit entry with those;
from the last checkpoint at least ``margin`` characters before the first difference with
the closest one it tokenizes only the rest (same anchor/check argument). So a request that
shares a long prefix with an earlier one (system prompt, previous turn) tokenizes about
``tail_step + margin`` characters plus its new text, not up to a chunk. When it grew past
chunk boundaries, the new chunk entries take their cuts from the old tail's checkpoints
(before the resumption) or from the new encoding (after it), and the new tail goes to the
deepest one. Without a usable tail, tokenization resumes at the last entry's anchor.

Threading: the cache is guarded by a lock held only for dict work, not while encoding (the
tokenizer releases the GIL, so long prompts may be encoded in a thread).
"""

from __future__ import annotations

import itertools
import logging
import threading
from bisect import bisect_right
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
# Characters between tail checkpoints: at most this much shared text is tokenized again.
DEFAULT_TAIL_STEP = 32
# Tails longer than this many chunks (one word over several chunks: no entry) are not kept.
_MAX_TAIL_CHUNKS = 2
# Tails kept per entry (most recent first): a lookup compares the prompt with each.
_TAILS_PER_ENTRY = 4


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

    @property
    def cost(self) -> int:
        return len(self.ids)


_ROOT = _Entry(0, 0, 0, array("I"))


class _Tail:
    """The text after an entry's cut of a prompt that ended there, with its token ids and
    checkpoints (all positions relative to the entry's cut; ascending cuts). Immutable
    once stored (a plain class: built on every warm request, a frozen dataclass is 3x
    slower to create)."""
    __slots__ = ("text", "ids", "cuts", "anchors", "toks", "cost")

    def __init__(self, text: str, ids: array, cuts: array, anchors: array, toks: array) -> None:
        self.text = text
        self.ids = ids
        self.cuts = cuts  # word starts at which tokenization may resume
        self.anchors = anchors  # start of the word before each cut
        self.toks = toks  # index in `ids` of the token starting at each cut
        self.cost = len(ids) + len(cuts)  # in tokens' worth of memory (~9 bytes each)


class _Tails:
    """The tails of the last prompts that ended after one entry, most recent first."""
    __slots__ = ("tails", "cost")

    def __init__(self, tails: tuple[_Tail, ...]) -> None:
        self.tails = tails
        self.cost = sum(t.cost for t in tails)


@dataclass(slots=True)
class _Resume:
    """The tokens of a prompt after an entry's cut (`base`), from an encoding of
    text[enc_base:] whose token enc_first (starting at `resumed`) is rest[rest_at] (and,
    resuming from an old tail, that tail and the index of the last checkpoint valid for
    this prompt; before `resumed` the tokens come from that tail)."""
    base: int
    rest: array
    enc: Encoding
    enc_base: int
    enc_first: int
    rest_at: int
    resumed: int
    old: tuple[_Tail, int] | None = None
    extends: bool = False  # the prompt extends the old tail's text


@dataclass(slots=True)
class CacheStats:
    lookups: int = 0
    chunk_hits: int = 0  # chunks whose tokens were reused
    resync_failures: int = 0  # resumptions that failed the check (re-tokenized from further back)
    tail_hits: int = 0  # prompts resumed from a remembered tail (only new text tokenized)
    entries: int = 0  # chunk entries and tails
    cached_tokens: int = 0


class CachedTokenizer:
    """One model's tokenizer with its prompt-prefix cache."""

    def __init__(self, tokenizer: Tokenizer, *, chunk_chars: int = DEFAULT_CHUNK_CHARS,
                 cache_tokens: int = DEFAULT_CACHE_TOKENS, tail_step: int = DEFAULT_TAIL_STEP) -> None:
        if chunk_chars <= 0 or tail_step <= 0:
            raise ValueError("chunk_chars and tail_step must be positive")
        self.tail_step = tail_step
        tokenizer.no_truncation()
        tokenizer.no_padding()
        self.tokenizer = tokenizer
        self.chunk_chars = chunk_chars
        self.cache_tokens = cache_tokens
        added = tokenizer.get_added_tokens_decoder().values()
        longest_special = max((len(t.content) for t in added), default=0)
        self.margin = max(_MIN_MARGIN, longest_special + 8)
        self._frame_head, self._frame_tail = self._special_frame()
        # LRU of chunk entries, keyed (parent id, chunk text), and tails, keyed by entry id
        self._entries: OrderedDict[tuple[int, str] | int, _Entry | _Tails] = OrderedDict()
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
            if self._frame_head is None or self._frame_tail is None:
                return array("I", self.tokenizer.encode(text, add_special_tokens=True).ids)
            return _join([self._frame_head, *self._encode_body(text), self._frame_tail])
        return _join(self._encode_body(text))

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
                assert isinstance(e, _Entry)
                self._entries.move_to_end(key)
                hits.append(e)
                parent = e.id
            self.stats.chunk_hits += len(hits)
        return hits

    def _encode_body(self, text: str) -> list[array]:
        """The ids of `text` (no special tokens) in pieces, to be joined."""
        n_chunks = len(text) // self.chunk_chars
        hits = self._lookup(text, n_chunks) if n_chunks else []
        last = hits[-1] if hits else _ROOT
        r = self._resume_from_tail(text, last)
        if isinstance(r, array):  # the same prompt again
            return [*(e.ids for e in hits), r]
        if r is None:  # no usable tail: from the last chunk entry's anchor
            enc = self.tokenizer.encode(text[last.anchor:], add_special_tokens=False)
            start = self._resume_index(enc, last.cut - last.anchor)
            if start is None:
                with self._lock:
                    self.stats.resync_failures += 1
                hits, last = [], _ROOT
                enc = self.tokenizer.encode(text, add_special_tokens=False)
                start = 0
            ids = enc.ids
            r = _Resume(last.cut, array("I", ids[start:] if start else ids), enc, last.anchor, start, 0, last.cut)
        new: list[tuple[tuple[int, str], _Entry]] = []
        end, end_at = self._new_entries(text, hits, last, r, n_chunks, new)
        tail = None
        if len(text) - end.cut <= _MAX_TAIL_CHUNKS * self.chunk_chars:
            tail = self._tail_of(text, r, end.cut, end_at)
        replaces = r.old[0] if r.old is not None and r.extends and end is last else None
        self._store(new, end.id, tail, replaces=replaces, tail_hit=r.old is not None)
        return [*(e.ids for e in hits), r.rest]

    def _resume_from_tail(self, text: str, last: _Entry) -> _Resume | array | None:
        """Tokenize text[last.cut:] from the closest of `last`'s tails (module docstring):
        its ids if it is that tail's text again, else the resumption; None if no tail
        shares enough or the check fails."""
        with self._lock:
            got = self._entries.get(last.id)
            if got is None:
                return None
            self._entries.move_to_end(last.id)
        assert isinstance(got, _Tails)
        base = last.cut
        tail = got.tails[0]
        same = _common_prefix(text, base, tail.text)
        for t in got.tails[1:]:
            # only a tail that shares one more character can be closer (one memcmp)
            if len(t.text) > same and text.startswith(t.text[:same + 1], base):
                n = _common_prefix(text, base, t.text)
                if n > same:
                    tail, same = t, n
        if same == len(tail.text) == len(text) - base:
            with self._lock:
                self.stats.tail_hits += 1
            return tail.ids
        k = bisect_right(tail.cuts, same - self.margin) - 1
        if k < 0:
            return None
        cut, anchor, tok = tail.cuts[k], tail.anchors[k], tail.toks[k]
        enc = self.tokenizer.encode(text[base + anchor:], add_special_tokens=False)
        start = self._resume_index(enc, cut - anchor)
        if start is None:
            with self._lock:
                self.stats.resync_failures += 1
            return None
        rest = tail.ids[:tok]
        rest.extend(enc.ids[start:])
        return _Resume(base, rest, enc, base + anchor, start, tok, base + cut, (tail, k), same == len(tail.text))

    def _word_start(self, r: _Resume, limit: int) -> tuple[int, int, int] | None:
        """The last known word start at or before `limit` (absolute) in the remainder `r`:
        (its position, its anchor's, its token's index in r.rest), or None."""
        if r.old is not None and limit < r.resumed:
            tail, k = r.old  # before the resumption: the tail's (still valid) checkpoints
            j = bisect_right(tail.cuts, limit - r.base, 0, k + 1) - 1
            if j < 0:
                return None
            return r.base + tail.cuts[j], r.base + tail.anchors[j], tail.toks[j]
        got = _word_start(r.enc, limit - r.enc_base, r.enc_first)
        if got is None:
            return None
        cut, anchor, i = got
        return cut + r.enc_base, anchor + r.enc_base, i - r.enc_first + r.rest_at

    def _tail_of(self, text: str, r: _Resume, at: int, at_tok: int) -> _Tail:
        """The tail of `text` after position `at`, whose token is r.rest[at_tok]: checkpoints
        from the old tail up to the resumption, then every tail_step characters."""
        cuts, anchors, toks = array("I"), array("I"), array("I")
        first = at
        if r.old is not None:
            tail, k = r.old
            if at == r.base:
                cuts, anchors, toks = tail.cuts[:k + 1], tail.anchors[:k + 1], tail.toks[:k + 1]
            else:
                for j in range(k + 1):
                    c, a = r.base + tail.cuts[j], r.base + tail.anchors[j]
                    if c > at and a >= at:
                        cuts.append(c - at)
                        anchors.append(a - at)
                        toks.append(tail.toks[j] - at_tok)
            first = max(at, r.resumed)
        enc = r.enc
        end = r.enc_base + (enc.token_to_chars(len(enc) - 1)[1] if len(enc) else 0)
        for target in range(first + self.tail_step, end, self.tail_step):
            got = self._word_start(r, target)
            if got is None:
                continue
            c, a, t = got
            if a >= at and t >= at_tok and (not cuts or c - at > cuts[-1]):
                cuts.append(c - at)
                anchors.append(a - at)
                toks.append(t - at_tok)
        return _Tail(text[at:], r.rest[at_tok:], cuts, anchors, toks)

    @staticmethod
    def _resume_index(enc: Encoding, rel_cut: int) -> int | None:
        if rel_cut == 0:
            return 0
        i = enc.char_to_token(rel_cut)
        if i is None or enc.token_to_chars(i)[0] != rel_cut:
            return None
        return i

    def _new_entries(self, text: str, hits: list[_Entry], last: _Entry, r: _Resume, n_chunks: int,
                     new: list[tuple[tuple[int, str], _Entry]]) -> tuple[_Entry, int]:
        """Entries for the chunks after the hits, appended to `new`; returns the deepest
        entry and the index in r.rest of its cut's token."""
        prev, prev_at = last, 0
        size = self.chunk_chars
        for k in range(len(hits), n_chunks):
            got = self._word_start(r, (k + 1) * size - self.margin)
            if got is None or got[0] <= prev.cut:
                break  # one word spans the whole chunk: nothing safe to cache here
            cut, anchor, at = got
            entry = _Entry(next(self._ids), cut, anchor, r.rest[prev_at:at])
            new.append(((prev.id, text[k * size:(k + 1) * size]), entry))
            prev, prev_at = entry, at
        return prev, prev_at

    def _store(self, new: list[tuple[tuple[int, str], _Entry]], tail_key: int, tail: _Tail | None,
               replaces: _Tail | None = None, tail_hit: bool = False) -> None:
        """Add chunk entries and a tail after entry `tail_key` (in front of the entry's
        other tails, instead of `replaces`), then evict down to the budget."""
        with self._lock:
            self.stats.tail_hits += tail_hit
            items: list[tuple[tuple[int, str] | int, _Entry | _Tails]] = list(new)
            if tail is not None:
                old = self._entries.get(tail_key)
                others = old.tails if isinstance(old, _Tails) else ()
                kept = [t for t in others if t is not replaces and t.text != tail.text]
                items.append((tail_key, _Tails((tail, *kept[:_TAILS_PER_ENTRY - 1]))))
            for key, value in items:
                prev = self._entries.pop(key, None)
                if prev is not None:
                    self.stats.cached_tokens -= prev.cost
                self._entries[key] = value
                self.stats.cached_tokens += value.cost
            while self.stats.cached_tokens > self.cache_tokens and self._entries:
                _, dropped = self._entries.popitem(last=False)
                self.stats.cached_tokens -= dropped.cost
            self.stats.entries = len(self._entries)


def _word_start(enc: Encoding, rel: int, lo: int) -> tuple[int, int, int] | None:
    """The start of the last word of `enc` beginning at or before character `rel`, the start
    of the word before it (both relative to enc's text) and its first token's index (>= lo);
    None if there is none or it is enc's first word. Binary search with the O(1) accessors
    (token_to_chars, token_to_word): char_to_word and word_to_tokens scan the encoding."""
    n = len(enc)
    if lo >= n or enc.token_to_chars(lo)[0] > rel:
        return None
    a, b = lo, n  # the last token starting at or before rel is in [a, b)
    while b - a > 1:
        mid = (a + b) // 2
        if enc.token_to_chars(mid)[0] <= rel:
            a = mid
        else:
            b = mid
    word = enc.token_to_word(a)
    while a > 0 and word is not None and enc.token_to_word(a - 1) == word:
        a -= 1  # the word's first token
    if word is None or a < lo or a == 0:
        return None
    prev = a - 1
    prev_word = enc.token_to_word(prev)
    while prev > 0 and prev_word is not None and enc.token_to_word(prev - 1) == prev_word:
        prev -= 1
    if prev_word is None:
        return None
    return enc.token_to_chars(a)[0], enc.token_to_chars(prev)[0], a


_ZERO = array("I", [0])


def _join(parts: list[array]) -> array:
    """Concatenate arrays into one allocated at its final size (`+=` on a growing array
    copies it again and again: 4x slower at 100k tokens)."""
    out = _ZERO * sum(map(len, parts))
    at = 0
    for p in parts:
        out[at:at + len(p)] = p
        at += len(p)
    return out


def _common_prefix(text: str, start: int, other: str) -> int:
    """Length of the common prefix of text[start:] and `other` (O(n) copying in total)."""
    n = min(len(text) - start, len(other))
    if text.startswith(other if n == len(other) else other[:n], start):
        return n
    lo, hi = 0, n  # text[start:start+lo] == other[:lo]; the first hi characters differ
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if text.startswith(other[lo:mid], start + lo):
            lo = mid
        else:
            hi = mid
    return lo


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
