"""The model's own chat template (tokenizer_config.json), rendered as vLLM renders it.

vLLM's chat endpoint calls `tokenizer.apply_chat_template(conversation, tools=...,
add_generation_prompt=..., continue_final_message=..., tokenize=False,
**chat_template_kwargs)`; transformers compiles the Jinja source in an
`ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)` with the
`loopcontrols` extension, a `tojson` filter, `raise_exception` and `strftime_now`, and
passes the special tokens (bos_token, eos_token, ...) as variables. We do the same, so
the text (and hence the tokens and block hashes) equals the engine's.

Not reproduced: vLLM's content normalisation for templates that expect string content
(it joins text parts), `{% generation %}` tags, multimodal placeholders. A difference only
costs cache misses; a template error makes the caller fall back to prefix-cache matching.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

__all__ = ["ChatTemplate", "load_chat_template"]

_SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


def _raise(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class ChatTemplate:
    """One compiled template plus the special-token variables it is rendered with."""

    def __init__(self, source: str, special: Mapping[str, str]) -> None:
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=[jinja2.ext.loopcontrols])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = _strftime_now
        self._template = env.from_string(source)
        self._special = dict(special)

    def render(self, body: Mapping[str, Any]) -> str:
        """The prompt text of a chat request body; raises on a bad body or template error."""
        messages = body.get("messages")
        if not isinstance(messages, list):
            raise ValueError("'messages' must be a list")
        agp = body.get("add_generation_prompt")
        cont = body.get("continue_final_message")
        kw = body.get("chat_template_kwargs")
        return self._template.render(
            **self._special,
            **(kw if isinstance(kw, dict) else {}),
            messages=messages,
            tools=body.get("tools"),
            documents=body.get("documents"),
            add_generation_prompt=agp if isinstance(agp, bool) else True,
            continue_final_message=cont if isinstance(cont, bool) else False,
        )


def _token_text(v: Any) -> str | None:
    if isinstance(v, str):
        return v
    if isinstance(v, dict) and isinstance(v.get("content"), str):
        return v["content"]  # AddedToken serialised as a dict
    return None


def load_chat_template(tokenizer_json: str | Path) -> ChatTemplate | None:
    """The template next to a tokenizer.json (chat_template.jinja, else tokenizer_config.json's
    `chat_template`, a string or a list of {name, template} where "default" wins); None if
    there is none."""
    d = Path(tokenizer_json).parent
    cfg: dict[str, Any] = {}
    try:
        cfg = json.loads((d / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        pass
    source: Any = None
    jinja_file = d / "chat_template.jinja"
    if jinja_file.is_file():
        source = jinja_file.read_text()
    else:
        source = cfg.get("chat_template")
        if isinstance(source, list):
            named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
            source = named.get("default") or next(iter(named.values()), None)
    if not isinstance(source, str):
        return None
    special = {k: t for k in _SPECIAL_KEYS if (t := _token_text(cfg.get(k))) is not None}
    return ChatTemplate(source, special)
