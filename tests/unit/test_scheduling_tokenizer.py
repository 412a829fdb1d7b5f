"""Tokenizer prefix cache: ids equal full tokenization (hypothesis), on the simulator's
ByteLevel tokenizer and on Metaspace / Llama-3-style tokenizers trained in fixtures."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from kthena_router.scheduling.chat_template import load_chat_template
from kthena_router.scheduling.tokenizer_cache import (
    CachedTokenizer,
    TokenizerRegistry,
    TokenizerUnavailable,
    engine_adds_special_tokens,
)

SIM_TOKENIZER = Path(__file__).resolve().parents[2] / "loadtest" / "simulator" / "tokenizer" / "tokenizer.json"
SPECIALS = ["<s>", "</s>", "<|eot_id|>", "<|start_header_id|>"]
CORPUS = [
    "The quick brown fox jumps over the lazy dog. We're here, it's 2024-05-01 12345!",
    "def f(x):\n    return x ** 2  # café naïve résumé 東京 😀\n\n\n",
    "   leading spaces\ttabs\r\nwindows lines and 'quotes' \"double\" <|eot_id|> end",
] * 20

# Words and separators that stress pre-tokenizer boundaries (contractions, digits,
# whitespace runs, special tokens, multi-byte characters).
ALPHABET = st.sampled_from([
    "the", "quick", "fox", "We", "'re", "'s", "'", "12", "345", "6", " ", "  ", "\n", "\n\n", "\t",
    "é", "東京", "😀", "<|eot_id|>", "<|start_header_id|>", "<|eot", "_id|>", "<s>", ".", "!!", "-",
])
TEXT = st.lists(ALPHABET, max_size=120).map("".join)


def _metaspace() -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", *SPECIALS]))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    return tok


def _llama3_style() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    split = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
             r"|\s*[\r\n]+|\s+(?!\S)|\s+")
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(split), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=400, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A </s>", special_tokens=[
        ("<s>", tok.token_to_id("<s>")), ("</s>", tok.token_to_id("</s>"))])
    return tok


TOKENIZERS = {
    "simulator": lambda: Tokenizer.from_file(str(SIM_TOKENIZER)),
    "metaspace": _metaspace,
    "llama3-style": _llama3_style,
}


@pytest.fixture(scope="module", params=list(TOKENIZERS))
def pair(request) -> tuple[Tokenizer, CachedTokenizer]:
    make = TOKENIZERS[request.param]
    # small chunks so that short generated texts cross many chunk boundaries
    return make(), CachedTokenizer(make(), chunk_chars=40, cache_tokens=50_000)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shared=TEXT, tails=st.lists(TEXT, min_size=1, max_size=4), special=st.booleans())
def test_prefix_cache_equals_full_tokenization(pair, shared, tails, special):
    reference, cached = pair
    for tail in tails:
        text = shared + tail
        assert cached.encode(text, special).tolist() == reference.encode(text, add_special_tokens=special).ids


def test_shared_prefix_is_reused(pair):
    reference, cached = pair
    cached.clear()
    shared = " ".join(CORPUS[:6])
    before = cached.stats.chunk_hits
    for q in ("first question?", "a different one!", "third"):
        text = shared + q
        assert cached.encode(text, True).tolist() == reference.encode(text, add_special_tokens=True).ids
    # the 2nd and 3rd prompts reuse every full chunk of the shared part
    assert cached.stats.chunk_hits - before >= 2 * (len(shared) // cached.chunk_chars) - 2
    assert cached.stats.resync_failures == 0


def test_cache_is_bounded(pair):
    reference, _ = pair
    small = CachedTokenizer(TOKENIZERS["simulator"](), chunk_chars=32, cache_tokens=200)
    for i in range(50):
        small.encode(f"{i} " + CORPUS[i % 3] * 3, False)
        assert small.stats.cached_tokens <= 200
    assert small.stats.entries > 0


def test_one_giant_word_is_not_cached():
    tok = Tokenizer.from_file(str(SIM_TOKENIZER))
    cached = CachedTokenizer(Tokenizer.from_file(str(SIM_TOKENIZER)), chunk_chars=64)
    text = "x" * 1000  # a single pre-tokenizer word: no safe cut inside
    assert cached.encode(text, False).tolist() == tok.encode(text, add_special_tokens=False).ids
    assert cached.stats.entries == 0


def test_truncation_in_tokenizer_json_is_ignored():
    tok = Tokenizer.from_file(str(SIM_TOKENIZER))
    tok.enable_truncation(8)
    cached = CachedTokenizer(tok)
    full = Tokenizer.from_file(str(SIM_TOKENIZER)).encode("word " * 100, add_special_tokens=False).ids
    assert len(full) > 8 and cached.encode("word " * 100, False).tolist() == full


def test_engine_adds_special_tokens():
    assert engine_adds_special_tokens({}, chat=False) is True
    assert engine_adds_special_tokens({}, chat=True) is False
    assert engine_adds_special_tokens({"add_special_tokens": True}, chat=True) is True
    assert engine_adds_special_tokens({"add_special_tokens": "yes"}, chat=False) is True


def test_registry_loads_once_and_shares(tmp_path):
    reg = TokenizerRegistry({"a": str(SIM_TOKENIZER), "b": str(SIM_TOKENIZER), "broken": str(tmp_path / "nope.json")})
    a = reg.get("a")
    assert a is not None and reg.get("a") is a and reg.get("b") is a
    assert reg.get("unknown") is None
    with pytest.raises(TokenizerUnavailable, match="nope.json"):
        reg.get("broken")
    assert [e.split(":")[0] for e in reg.load_all()] == ["broken"]


# --- tails: a prompt extending or sharing a prefix with an earlier one tokenizes only the
# --- text after the last checkpoint before the first difference

@pytest.fixture(scope="module", params=[(name, chunk) for name in TOKENIZERS for chunk in (40, 4096)],
                ids=lambda p: f"{p[0]}-chunk{p[1]}")
def tail_pair(request) -> tuple[Tokenizer, CachedTokenizer]:
    name, chunk = request.param
    make = TOKENIZERS[name]
    # dense checkpoints, chunks shorter and longer than the generated prompts
    return make(), CachedTokenizer(make(), chunk_chars=chunk, cache_tokens=50_000, tail_step=5)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 10_000), TEXT), min_size=1, max_size=8),
       special=st.booleans())
def test_tails_equal_full_tokenization(tail_pair, steps, special):
    """Each prompt is an earlier one (or nothing) cut anywhere, plus new text: edits,
    extensions, truncations and repeats, each checked against tokenizing from scratch."""
    reference, cached = tail_pair
    prompts = [""]
    for pick, cut, extra in steps:
        base = prompts[pick % len(prompts)]
        text = base[:cut % (len(base) + 1)] + extra
        assert cached.encode(text, special).tolist() == reference.encode(text, add_special_tokens=special).ids
        prompts.append(text)


class _Recording:
    """A tokenizer that records the length of every text it encodes."""

    def __init__(self, tok: Tokenizer) -> None:
        self.tok = tok
        self.lengths: list[int] = []

    def encode(self, text: str, add_special_tokens: bool = True):
        self.lengths.append(len(text))
        return self.tok.encode(text, add_special_tokens=add_special_tokens)

    def __getattr__(self, name: str):
        return getattr(self.tok, name)


def _conversations(n: int, turns: int, seed: int) -> list[list[str]]:
    """Rendered multi-turn chats sharing a long system prompt (the simulator's template),
    each turn's prompt extending the previous one."""
    template = load_chat_template(SIM_TOKENIZER)
    assert template is not None
    rng = random.Random(seed)
    words = " ".join(CORPUS).split()
    say = lambda k: " ".join(rng.choice(words) for _ in range(k))  # noqa: E731
    system = say(1500)
    out = []
    for _ in range(n):
        messages = [{"role": "system", "content": system}]
        prompts = []
        for _ in range(turns):
            messages.append({"role": "user", "content": say(rng.randint(3, 80)) + "?"})
            prompts.append(template.render({"messages": messages}))
            messages.append({"role": "assistant", "content": say(rng.randint(10, 300))})
        out.append(prompts)
    return out


def test_chat_turns_tokenize_only_new_text():
    """Interleaved multi-turn conversations over a shared ~1.5k-word system prompt: every
    prompt equals full tokenization; once warm, a turn tokenizes little more than its new
    text (the previous answer, the new question, the template around them)."""
    reference = Tokenizer.from_file(str(SIM_TOKENIZER))
    rec = _Recording(Tokenizer.from_file(str(SIM_TOKENIZER)))
    cached = CachedTokenizer(Tokenizer.from_file(str(SIM_TOKENIZER)), chunk_chars=4096)
    cached.tokenizer = rec  # type: ignore[assignment]
    convs = _conversations(4, 6, seed=3)
    warm = []
    for turn in range(6):
        for c, prompts in enumerate(convs):
            text = prompts[turn]
            rec.lengths.clear()
            assert cached.encode(text, False).tolist() == reference.encode(text, add_special_tokens=False).ids
            if turn or c:
                seen = prompts[turn - 1] if turn else os.path.commonprefix([text, convs[0][0]])
                new = len(text) - len(seen)
                warm.append((sum(rec.lengths), new))
    assert cached.stats.resync_failures == 0 and cached.stats.tail_hits >= len(warm) - 2
    # new text plus at most a checkpoint step, the margin and the word before the cut,
    # also when the prompt grew past a chunk boundary (prompts here are 8.6k-15k chars)
    assert all(n_chars <= new + cached.tail_step + cached.margin + 16 for n_chars, new in warm), warm
    assert cached.stats.chunk_hits > 0 and max(len(p[-1]) for p in convs) > 3 * cached.chunk_chars


def test_same_question_again_tokenizes_nothing():
    rec = _Recording(Tokenizer.from_file(str(SIM_TOKENIZER)))
    cached = CachedTokenizer(Tokenizer.from_file(str(SIM_TOKENIZER)), chunk_chars=256)
    text = " ".join(CORPUS[:8])
    first = cached.encode(text, True).tolist()
    cached.tokenizer = rec  # type: ignore[assignment]
    assert cached.encode(text, True).tolist() == first and rec.lengths == []
    shorter = text[:-40]
    assert cached.encode(shorter, True).tolist() == Tokenizer.from_file(str(SIM_TOKENIZER)).encode(shorter).ids
    assert 0 < sum(rec.lengths) <= cached.tail_step + cached.margin + 40


def test_tails_count_in_the_bound():
    small = CachedTokenizer(Tokenizer.from_file(str(SIM_TOKENIZER)), chunk_chars=4096, cache_tokens=1000)
    for i in range(40):
        small.encode(f"{i} " + CORPUS[i % 3] * 2, False)  # shorter than a chunk: tails only
        assert 0 < small.stats.cached_tokens <= 1000
    small.clear()
    assert small.stats.cached_tokens == 0 and small.stats.entries == 0


@pytest.mark.parametrize("name", list(TOKENIZERS))
def test_random_walk_of_prompts_equals_full_tokenization(name):
    """Longer prompts than the property test's (several chunks): each is an earlier one
    cut near its end and extended with words, whitespace runs, specials, multi-byte text."""
    rng = random.Random(7)
    words = " ".join(CORPUS).split() + ["\n\n", "<|eot_id|>", "  ", "東京", "😀", "12345", "'re"]
    reference, cached = TOKENIZERS[name](), CachedTokenizer(TOKENIZERS[name](), chunk_chars=300, tail_step=16)
    prompts = [""]
    for _ in range(250):
        base = prompts[-1] if rng.random() < 0.6 else rng.choice(prompts)
        text = base[:rng.randint(max(0, len(base) - 100), len(base))]
        text += " ".join(rng.choice(words) for _ in range(rng.randint(0, 60)))
        assert cached.encode(text, False).tolist() == reference.encode(text, add_special_tokens=False).ids
        prompts.append(text)
    assert max(map(len, prompts)) > 10 * cached.chunk_chars
    assert cached.stats.tail_hits > 100 and cached.stats.chunk_hits > 100
