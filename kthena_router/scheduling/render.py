"""Canonical prompt bytes for the approximate `prefix-cache` plugin.

The bytes are hashed in fixed-size blocks as a chain, so all that matters is: equal
requests give equal bytes, and requests that share a leading part of their prompt (a system
prompt, tool definitions, earlier turns, a document at the start of a user message) share
a leading part of their bytes. The form is not the engine's chat template (the router does
not know it); it is ChatML-like, so that the bytes are text much as the engine sees them.

Chat (``render_chat``), UTF-8:

    [<|tools|>{tools as JSON, keys sorted}<|/tools|>\\n]          only if tools are given
    for each message:
      <|im_start|>{role}[ name={name}][ tool_call_id={id}]\\n
      {content}
      for each tool call: <|tool_call|>{function.name}\\n{function.arguments}<|/tool_call|>
      <|im_end|>\\n

``content``: a string verbatim; a list of parts concatenated without separator, where a
``text`` (or ``input_text``/``output_text``) part is its text, an ``image_url`` part is
``<|image|>{url}<|/image|>`` (data URLs included: the same image gives the same bytes), any
other part is ``<|{type}|>{part as JSON, keys sorted}``; ``null`` or absent is empty; any
other value is its JSON. Tool-call arguments are copied as sent (a string), not re-encoded.
Fields that do not change the prompt (``reasoning_content``, ``refusal``) are left out.

Completion (``render_completion``): a string is its UTF-8; a list of one prompt is that
prompt; token ids are ``\\x00ids\\x00`` followed by little-endian u32 per id (so a 64-byte
block is 15-16 tokens, and ids never collide with text); a batch of several prompts is
their renderings joined by ``\\x00\\n`` (only the first prompt's prefix matters for routing).

Collisions (two different requests with equal bytes, e.g. a role name containing
"\\n") only cost a wrong guess of the approximate index, never a wrong answer.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

__all__ = ["render_chat", "render_completion", "render_request"]

_SORTED = orjson.OPT_SORT_KEYS
_TEXT_PARTS = frozenset(("text", "input_text", "output_text"))
_BATCH_SEP = b"\x00\n"
_IDS_MARK = b"\x00ids\x00"
_LITTLE = sys.byteorder == "little"


def _json(v: Any) -> str:
    try:
        return orjson.dumps(v, option=_SORTED).decode()
    except TypeError:  # not JSON (non-string keys, too deep, ...): still deterministic
        try:
            return repr(v)
        except RecursionError:  # deeper than repr goes: such prompts are not worth matching
            raise ValueError("value nested too deeply to render") from None


def _content(out: list[str], content: Any) -> None:
    if isinstance(content, str):
        out.append(content)
    elif isinstance(content, list):
        for part in content:
            if not isinstance(part, Mapping):
                out.append(_json(part))
                continue
            kind = part.get("type")
            if kind in _TEXT_PARTS and isinstance(part.get("text"), str):
                out.append(part["text"])
            elif kind == "image_url":
                img = part.get("image_url")
                url = img.get("url") if isinstance(img, Mapping) else img
                out.append(f"<|image|>{url if isinstance(url, str) else _json(img)}<|/image|>")
            else:
                out.append(f"<|{kind}|>{_json(part)}")
    elif content is not None:
        out.append(_json(content))


def render_chat(messages: Sequence[Any], tools: Any = None) -> bytes:
    """Canonical bytes of a chat request's ``messages`` (and ``tools``, if any)."""
    out: list[str] = []
    if tools:
        out.append(f"<|tools|>{_json(tools)}<|/tools|>\n")
    for m in messages:
        if not isinstance(m, Mapping):
            out.append(f"<|im_start|>\n{_json(m)}<|im_end|>\n")
            continue
        role = m.get("role")
        out.append(f"<|im_start|>{role if isinstance(role, str) else _json(role)}")
        name = m.get("name")
        if name is not None:
            out.append(f" name={name}")
        call_id = m.get("tool_call_id")
        if call_id is not None:
            out.append(f" tool_call_id={call_id}")
        out.append("\n")
        _content(out, m.get("content"))
        calls = m.get("tool_calls")
        if isinstance(calls, list):
            for call in calls:
                fn = call.get("function") if isinstance(call, Mapping) else None
                if isinstance(fn, Mapping):
                    args = fn.get("arguments")
                    args_s = args if isinstance(args, str) else _json(args)
                    out.append(f"<|tool_call|>{fn.get('name')}\n{args_s}<|/tool_call|>")
                else:
                    out.append(f"<|tool_call|>{_json(call)}<|/tool_call|>")
        out.append("<|im_end|>\n")
    # surrogatepass: a lone surrogate (possible in JSON "\ud800") must not make us fail
    return "".join(out).encode("utf-8", "surrogatepass")


def _ids(ids: Sequence[Any]) -> bytes:
    try:
        a = array("I", ids)  # rejects negatives, ids >= 2**32 and non-integers
    except (OverflowError, TypeError) as e:
        raise ValueError(f"token ids must be integers in [0, 2**32): {e}") from None
    if not _LITTLE:
        a.byteswap()
    return _IDS_MARK + a.tobytes()


def _one(prompt: Any) -> bytes:
    if isinstance(prompt, str):
        return prompt.encode("utf-8", "surrogatepass")
    if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return _ids(prompt)
    raise ValueError("a prompt must be a string or a list of token ids")


def render_completion(prompt: Any) -> bytes:
    """Canonical bytes of a completion request's ``prompt``: a string, a list of strings,
    a list of token ids or a list of lists of token ids. ValueError for other shapes."""
    if isinstance(prompt, str):
        return prompt.encode("utf-8", "surrogatepass")
    if not isinstance(prompt, list):
        raise ValueError("'prompt' must be a string, a list of strings or token ids")
    if not prompt:
        return b""
    if isinstance(prompt[0], int) and not isinstance(prompt[0], bool):
        return _one(prompt)
    if len(prompt) == 1:
        return _one(prompt[0])
    return _BATCH_SEP.join(_one(p) for p in prompt)


def render_request(body: Mapping[str, Any], chat: bool) -> bytes:
    """The prompt bytes of a parsed request body (chat: messages + tools; else prompt)."""
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list):
            raise ValueError("'messages' must be a list")
        return render_chat(messages, body.get("tools"))
    return render_completion(body.get("prompt"))
