"""The simulator's tokenizer: a shipped Hugging Face `tokenizer.json` plus a chat template.

Chat template (Llama-3-like, also written as Jinja in tokenizer_config.json):

    <|begin_of_text|>
    for each message: <|start_header_id|>{role}<|end_header_id|>\\n\\n{content}<|eot_id|>
    then (add_generation_prompt, the default): <|start_header_id|>assistant<|end_header_id|>\\n\\n

`content` is a string or a list of parts, of which the `text` parts are joined.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from tokenizers import Tokenizer

HERE = Path(__file__).resolve().parent
TOKENIZER_PATH = HERE / "tokenizer.json"
BOS = "<|begin_of_text|>"
EOS = "<|end_of_text|>"
SPECIAL_TOKENS = (BOS, EOS, "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")

CHAT_TEMPLATE_JINJA = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for p in m['content'] %}"
    "{% if p['type'] == 'text' %}{{ p['text'] }}{% endif %}{% endfor %}{% endif %}<|eot_id|>"
    "{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n"
    "{% endif %}"
)

# Words the fake generator cycles through (each a single token in the trained vocab).
_OUTPUT_TEXT = (
    " The engine is a simulated model and this answer is made of ordinary words so that"
    " the router can count tokens and people can read the stream as it comes out"
)


class ChatTemplateError(ValueError):
    """A message list the template cannot render (bad shape)."""


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for part in content:
            if not isinstance(part, dict):
                raise ChatTemplateError("message content parts must be objects")
            if part.get("type") == "text":
                text = part.get("text")
                if not isinstance(text, str):
                    raise ChatTemplateError("a text content part needs a string 'text'")
                out.append(text)
        return "".join(out)
    raise ChatTemplateError("message content must be a string or a list of parts")


def render_chat(messages: Any, add_generation_prompt: bool = True) -> str:
    if not isinstance(messages, list) or not messages:
        raise ChatTemplateError("'messages' must be a non-empty list")
    parts = [BOS]
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ChatTemplateError("each message must be an object with a string 'role'")
        parts.append(f"<|start_header_id|>{m['role']}<|end_header_id|>\n\n"
                     f"{_content_text(m.get('content'))}<|eot_id|>")
    if add_generation_prompt:
        parts.append("<|start_header_id|>assistant<|end_header_id|>\n\n")
    return "".join(parts)


@dataclass
class TextCodec:
    """The tokenizer plus pre-encoded output words, so streaming never calls decode."""

    tokenizer: Tokenizer
    output_ids: list[int]        # token ids of a readable sentence
    out_pieces: list[str]        # their texts
    out_json: list[bytes]        # their texts as JSON string literals (with quotes)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def token_strs(self, ids: list[int]) -> list[str]:
        return [self.tokenizer.id_to_token(i) or "" for i in ids]

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    # Generated token ids (random ones from the engine model) are shown as the words of
    # a fixed sentence, picked by id modulo its length, so that streams stay readable.
    def gen_json(self, token_id: int) -> bytes:
        return self.out_json[token_id % len(self.out_json)]

    def gen_text(self, ids: list[int]) -> str:
        out = self.out_pieces
        return "".join(out[i % len(out)] for i in ids)


def load_codec(path: Path = TOKENIZER_PATH) -> TextCodec:
    tok = Tokenizer.from_file(str(path))
    output_ids = tok.encode(_OUTPUT_TEXT, add_special_tokens=False).ids
    out_pieces = [tok.decode([i]) for i in output_ids]
    return TextCodec(tok, output_ids, out_pieces, [orjson.dumps(p) for p in out_pieces])
