"""Generate tokenizer.json (run once; the output is committed).

A byte-level BPE (GPT-2/Llama-3 style pre-tokenizer and decoder) trained on a
deterministic English-like corpus: common English words plus syllable-built words,
drawn with a Zipf law, in sentences with punctuation, numbers and newlines. Any
router that loads Hugging Face `tokenizer.json` files can load this one.

    python -m loadtest.simulator.tokenizer.build_tokenizer
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from . import BOS, CHAT_TEMPLATE_JINJA, EOS, SPECIAL_TOKENS, TOKENIZER_PATH

VOCAB_SIZE = 32000
SEED = 20251129

COMMON = """the of and to a in is it you that he was for on are with as I his they be at
one have this from or had by not word but what some we can out other were all there when
up use your how said an each she which do their time if will way about many then them
write would like so these her long make thing see him two has look more day could go come
did number sound no most people my over know water than call first who may down side been
now find any new work part take get place made live where after back little only round man
year came show every good me give our under name very through just form sentence great think
say help low line differ turn cause much mean before move right boy old too same tell does
set three want air well also play small end put home read hand port large spell add even land
here must big high such follow act why ask men change went light kind off need house picture
try us again animal point mother world near build self earth father head stand own page should
country found answer school grow study still learn plant cover food sun four between state keep
eye never last let thought city tree cross farm hard start might story saw far sea draw left
late run while press close night real life few north open seem together next white children
begin got walk example ease paper group always music those both mark often letter until mile
river car feet care second book carry took science eat room friend began idea fish mountain stop
once base hear horse cut sure watch color face wood main enough plain girl usual young ready
above ever red list though feel talk bird soon body dog family direct pose leave song measure
door product black short numeral class wind question happen complete ship area half rock order
fire south problem piece told knew pass since top whole king space heard best hour better true
during hundred five remember step early hold west ground interest reach fast verb sing listen
six table travel less morning ten simple several vowel toward war lay against pattern slow center
love person money serve appear road map rain rule govern pull cold notice voice unit power town
fine certain fly fall lead cry dark machine note wait plan figure star box noun field rest correct
able pound done beauty drive stood contain front teach week final gave green oh quick develop
ocean warm free minute strong special mind behind clear tail produce fact street inch multiply
nothing course stay wheel full force blue object decide surface deep moon island foot system busy
test record boat common gold possible plane stead dry wonder laugh thousand ago ran check game
shape equate hot miss brought heat snow tire bring yes distant fill east paint language among
model request token server engine cache memory router latency batch prompt answer user assistant
system message content stream data value error status health metric policy prefix block queue""".split()

ONSETS = ["", "b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "r", "s", "t", "v",
          "w", "z", "br", "cl", "cr", "dr", "fl", "gr", "pl", "pr", "sh", "st", "th", "tr", "ch"]
NUCLEI = ["a", "e", "i", "o", "u", "ai", "ea", "ee", "ou", "oo", "ie", "y"]
CODAS = ["", "", "n", "r", "s", "t", "l", "m", "nd", "st", "ng", "ck", "rt", "ns", "x"]
SUFFIXES = ["", "", "", "s", "ed", "ing", "er", "ly", "tion", "ment", "ness", "able"]


def _pseudo_word(rng: random.Random) -> str:
    n = rng.choice((1, 2, 2, 3, 3, 4))
    w = "".join(rng.choice(ONSETS) + rng.choice(NUCLEI) + rng.choice(CODAS) for _ in range(n))
    return w + rng.choice(SUFFIXES)


def corpus(rng: random.Random, n_sentences: int = 250_000):
    words = list(dict.fromkeys(COMMON + [_pseudo_word(rng) for _ in range(60_000)]))
    weights = [1.0 / (i + 1) ** 0.9 for i in range(len(words))]
    punct = [".", ".", ".", "?", "!", ",", ";", ":"]
    for _ in range(n_sentences):
        ws = rng.choices(words, weights, k=rng.randint(4, 18))
        ws[0] = ws[0].capitalize()
        if rng.random() < 0.1:
            ws.insert(rng.randrange(len(ws)), str(rng.randint(0, 99999)))
        if rng.random() < 0.05:
            ws.insert(rng.randrange(len(ws)), f'"{rng.choice(words)}"')
        yield " ".join(ws) + rng.choice(punct) + ("\n" if rng.random() < 0.2 else " ")


def build() -> Tokenizer:
    rng = random.Random(SEED)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(rng), trainer=trainer)
    finalize(tok)
    return tok


def finalize(tok: Tokenizer) -> None:
    """Like Llama-3's tokenizer.json: encode(..., add_special_tokens=True) prepends BOS."""
    bos_id = tok.token_to_id(SPECIAL_TOKENS[0])
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single=f"{SPECIAL_TOKENS[0]} $A",
                                      pair=f"{SPECIAL_TOKENS[0]} $A $B",
                                      special_tokens=[(SPECIAL_TOKENS[0], bos_id)]),
    ])


def write_config() -> None:
    """tokenizer_config.json beside it, so that tools that load a model directory (e.g. a
    peer router given this directory as its tokenizer path) get the same chat template."""
    cfg = {"bos_token": BOS, "eos_token": EOS, "add_bos_token": True,
           "model_max_length": 131072, "tokenizer_class": "PreTrainedTokenizerFast",
           "chat_template": CHAT_TEMPLATE_JINJA}
    (TOKENIZER_PATH.parent / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n")


def main() -> None:
    tok = build()
    tok.save(str(TOKENIZER_PATH), pretty=False)
    write_config()
    print(f"wrote {TOKENIZER_PATH} vocab={tok.get_vocab_size()} "
          f"bytes={Path(TOKENIZER_PATH).stat().st_size}")


if __name__ == "__main__":
    main()
