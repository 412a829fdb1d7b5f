//! The canonical prompt bytes of kthena_router/scheduling/render.py (`render_request`), for
//! the request shapes that are common, so that the front can pick a prefix-cache route on
//! its own thread. A rendering here is either byte for byte Python's, or `None` ("decline":
//! Python renders the request itself). Declining is always safe; a different byte is not.
//!
//! Rendered: chat messages that are objects with a string `role`, optional string (or null)
//! `name` and `tool_call_id`, `content` a string, null/absent, or a list of text parts
//! (`text`/`input_text`/`output_text` with a string `text`) and `image_url` parts (the URL a
//! string, or an object with a string `url`); `tool_calls` absent or null; `tools` absent or
//! falsy (null, [], {}, "", false, 0). Completion prompts: a string, a list of token ids in
//! [0, 2**32), or a list of strings and id lists. Everything else declines, and so does a
//! duplicate key among the fields Python reads (orjson keeps the last; we do not guess).
//!
//! Every value is walked in full (strings decoded, numbers parsed), the fields rendering
//! does not read included, so a body orjson would refuse (a lone surrogate, invalid UTF-8,
//! a number out of a double's range) never renders here. One pass over each value, no
//! `serde_json::Value` trees; strings without escapes are borrowed, not copied.

use std::borrow::Cow;
use std::fmt;

use pyo3::prelude::*;
use pyo3::types::PyBytes;
use serde::de::{self, value::MapAccessDeserializer, value::SeqAccessDeserializer, DeserializeSeed, Deserializer, MapAccess,
                SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;

use super::table::Checked;

const TEXT_PARTS: [&str; 3] = ["text", "input_text", "output_text"];
const IDS_MARK: &[u8] = b"\x00ids\x00";
const BATCH_SEP: &[u8] = b"\x00\n";

/// The keys any level of a request reads; the rest are `Other` (walked, not used).
enum Key {
    Role,
    Name,
    ToolCallId,
    Content,
    ToolCalls,
    Type,
    Text,
    ImageUrl,
    Url,
    Messages,
    Tools,
    Prompt,
    Other,
}

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_identifier(KeyVisitor)
    }
}

struct KeyVisitor;

impl Visitor<'_> for KeyVisitor {
    type Value = Key;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a key")
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<Key, E> {
        Ok(match s {
            "role" => Key::Role,
            "name" => Key::Name,
            "tool_call_id" => Key::ToolCallId,
            "content" => Key::Content,
            "tool_calls" => Key::ToolCalls,
            "type" => Key::Type,
            "text" => Key::Text,
            "image_url" => Key::ImageUrl,
            "url" => Key::Url,
            "messages" => Key::Messages,
            "tools" => Key::Tools,
            "prompt" => Key::Prompt,
            _ => Key::Other,
        })
    }
}

/// Reads the value of `name` into `slot`; a second one is an error (a duplicate key).
fn put<'de, T: Deserialize<'de>, A: MapAccess<'de>>(slot: &mut Option<T>, map: &mut A, name: &'static str)
                                                    -> Result<(), A::Error> {
    if slot.is_some() {
        return Err(de::Error::duplicate_field(name));
    }
    *slot = Some(map.next_value()?);
    Ok(())
}

fn skip<'de, A: MapAccess<'de>>(map: &mut A) -> Result<(), A::Error> {
    map.next_value::<Checked>().map(drop)
}

fn fail<E: de::Error>(what: &str) -> E {
    E::custom(format_args!("not rendered here: {what}"))
}

/// Any value, keeping a string (borrowed when it has no escape); others walked in full.
enum Val<'de> {
    Str(Cow<'de, str>),
    Null,
    Other,
}

impl<'de> Deserialize<'de> for Val<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ValVisitor { url: false })
    }
}

/// A part's `image_url` as Python reads it: the value itself, or an object's `url` (`Str`
/// only when that is a string; Python renders any other as JSON, which we do not).
struct Img<'de>(Val<'de>);

impl<'de> Deserialize<'de> for Img<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ValVisitor { url: true }).map(Img)
    }
}

/// `url`: an object's value is its `url` member when a string (`Other` otherwise).
struct ValVisitor {
    url: bool,
}

impl<'de> Visitor<'de> for ValVisitor {
    type Value = Val<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Val<'de>, E> {
        Ok(Val::Str(Cow::Borrowed(s)))
    }
    fn visit_str<E>(self, s: &str) -> Result<Val<'de>, E> {
        Ok(Val::Str(Cow::Owned(s.to_owned())))
    }
    fn visit_string<E>(self, s: String) -> Result<Val<'de>, E> {
        Ok(Val::Str(Cow::Owned(s)))
    }
    fn visit_unit<E>(self) -> Result<Val<'de>, E> {
        Ok(Val::Null)
    }
    fn visit_bool<E>(self, _: bool) -> Result<Val<'de>, E> {
        Ok(Val::Other)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Val<'de>, E> {
        Ok(Val::Other)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Val<'de>, E> {
        Ok(Val::Other)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Val<'de>, E> {
        Ok(Val::Other)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Val<'de>, A::Error> {
        Checked::deserialize(SeqAccessDeserializer::new(seq)).map(|_| Val::Other)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Val<'de>, A::Error> {
        if !self.url {
            return Checked::deserialize(MapAccessDeserializer::new(map)).map(|_| Val::Other);
        }
        let mut url: Option<Val<'de>> = None;
        while let Some(k) = map.next_key::<Key>()? {
            match k {
                Key::Url => put(&mut url, &mut map, "url")?,
                _ => skip(&mut map)?,
            }
        }
        Ok(match url {
            Some(Val::Str(s)) => Val::Str(s),
            _ => Val::Other,
        })
    }
}

/// One content part as rendered: a text, or an image's URL.
enum Piece<'de> {
    Text(Cow<'de, str>),
    Image(Cow<'de, str>),
}

impl<'de> Deserialize<'de> for Piece<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(PieceVisitor)
    }
}

struct PieceVisitor;

impl<'de> Visitor<'de> for PieceVisitor {
    type Value = Piece<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a content part")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Piece<'de>, A::Error> {
        let (mut kind, mut text, mut img): (Option<Val<'de>>, Option<Val<'de>>, Option<Img<'de>>) = (None, None, None);
        while let Some(k) = map.next_key::<Key>()? {
            match k {
                Key::Type => put(&mut kind, &mut map, "type")?,
                Key::Text => put(&mut text, &mut map, "text")?,
                Key::ImageUrl => put(&mut img, &mut map, "image_url")?,
                _ => skip(&mut map)?,
            }
        }
        match (kind, text, img) {
            (Some(Val::Str(k)), Some(Val::Str(t)), _) if TEXT_PARTS.contains(&&*k) => Ok(Piece::Text(t)),
            (Some(Val::Str(k)), _, Some(Img(Val::Str(u)))) if k == "image_url" => Ok(Piece::Image(u)),
            _ => Err(fail("content part")),
        }
    }
}

/// A message's `content`: null, a string, or a list of parts.
enum Content<'de> {
    Empty,
    Str(Cow<'de, str>),
    Parts(Vec<Piece<'de>>),
}

impl<'de> Deserialize<'de> for Content<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ContentVisitor)
    }
}

struct ContentVisitor;

impl<'de> Visitor<'de> for ContentVisitor {
    type Value = Content<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("null, a string or a list of parts")
    }
    fn visit_unit<E>(self) -> Result<Content<'de>, E> {
        Ok(Content::Empty)
    }
    fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Content<'de>, E> {
        Ok(Content::Str(Cow::Borrowed(s)))
    }
    fn visit_str<E>(self, s: &str) -> Result<Content<'de>, E> {
        Ok(Content::Str(Cow::Owned(s.to_owned())))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Content<'de>, A::Error> {
        let mut parts = Vec::with_capacity(seq.size_hint().unwrap_or(2));
        while let Some(p) = seq.next_element::<Piece>()? {
            parts.push(p);
        }
        Ok(Content::Parts(parts))
    }
}

/// Writes `s` after `tag` when present and a string; null or absent writes nothing.
fn optional<E: de::Error>(out: &mut Vec<u8>, tag: &[u8], v: Option<Val>) -> Result<(), E> {
    match v {
        None | Some(Val::Null) => Ok(()),
        Some(Val::Str(s)) => {
            out.extend_from_slice(tag);
            out.extend_from_slice(s.as_bytes());
            Ok(())
        }
        Some(Val::Other) => Err(fail("name or tool_call_id")),
    }
}

/// The list of messages, each rendered into `out` as it is read.
struct Messages<'o>(&'o mut Vec<u8>);

impl<'de> Visitor<'de> for Messages<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a list of messages")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element_seed(Message(&mut *self.0))?.is_some() {}
        Ok(())
    }
}

struct Message<'o>(&'o mut Vec<u8>);

impl<'de> DeserializeSeed<'de> for Message<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Message<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a message object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let (mut role, mut name, mut call_id, mut calls): (Option<Val>, Option<Val>, Option<Val>, Option<Val>) =
            (None, None, None, None);
        let mut content: Option<Content> = None;
        while let Some(k) = map.next_key::<Key>()? {
            match k {
                Key::Role => put(&mut role, &mut map, "role")?,
                Key::Name => put(&mut name, &mut map, "name")?,
                Key::ToolCallId => put(&mut call_id, &mut map, "tool_call_id")?,
                Key::Content => put(&mut content, &mut map, "content")?,
                Key::ToolCalls => put(&mut calls, &mut map, "tool_calls")?,
                _ => skip(&mut map)?,
            }
        }
        let Some(Val::Str(role)) = role else { return Err(fail("role")) };
        if !matches!(calls, None | Some(Val::Null)) {
            return Err(fail("tool_calls"));
        }
        let out = self.0;
        out.extend_from_slice(b"<|im_start|>");
        out.extend_from_slice(role.as_bytes());
        optional(out, b" name=", name)?;
        optional(out, b" tool_call_id=", call_id)?;
        out.push(b'\n');
        match content {
            None | Some(Content::Empty) => {}
            Some(Content::Str(s)) => out.extend_from_slice(s.as_bytes()),
            Some(Content::Parts(parts)) => {
                for p in parts {
                    match p {
                        Piece::Text(t) => out.extend_from_slice(t.as_bytes()),
                        Piece::Image(u) => {
                            out.extend_from_slice(b"<|image|>");
                            out.extend_from_slice(u.as_bytes());
                            out.extend_from_slice(b"<|/image|>");
                        }
                    }
                }
            }
        }
        out.extend_from_slice(b"<|im_end|>\n");
        Ok(())
    }
}

/// `tools` that Python's `if tools:` skips (falsy), spelled as JSON.
fn falsy(raw: &RawValue) -> bool {
    let t = raw.get().trim_ascii();
    let empty = |open: char, close: char| {
        t.strip_prefix(open).and_then(|r| r.strip_suffix(close)).is_some_and(|r| r.trim_ascii().is_empty())
    };
    matches!(t, "null" | "false" | "0" | "\"\"") || empty('[', ']') || empty('{', '}')
}

/// Python's `render_chat(messages, tools)` when the shapes are covered; None otherwise.
pub fn render_chat(messages: &RawValue, tools: Option<&RawValue>) -> Option<Vec<u8>> {
    if tools.is_some_and(|t| !falsy(t)) {
        return None; // rendered by Python: sorted-key orjson
    }
    let raw = messages.get();
    let mut out = Vec::with_capacity(raw.len() + 64);
    let mut de = serde_json::Deserializer::from_str(raw);
    de.deserialize_seq(Messages(&mut out)).ok()?;
    de.end().ok()?;
    Some(out)
}

/// One prompt of a completion's list: a string, a list of ids, or (first only) an id.
enum Item {
    Id,
    Other,
}

struct ItemSeed<'o> {
    out: &'o mut Vec<u8>,
    id_ok: bool,
}

impl<'de> DeserializeSeed<'de> for ItemSeed<'_> {
    type Value = Item;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Item, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ItemSeed<'_> {
    type Value = Item;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a prompt: a string or token ids")
    }
    fn visit_str<E>(self, s: &str) -> Result<Item, E> {
        self.out.extend_from_slice(s.as_bytes());
        Ok(Item::Other)
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Item, E> {
        if !self.id_ok {
            return Err(fail("an id among prompts"));
        }
        self.out.extend_from_slice(IDS_MARK);
        IdSeed(self.out).visit_u64(v).map(|_| Item::Id)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Item, A::Error> {
        self.out.reserve(IDS_MARK.len() + 4 * seq.size_hint().unwrap_or(0));
        self.out.extend_from_slice(IDS_MARK);
        while seq.next_element_seed(IdSeed(&mut *self.out))?.is_some() {}
        Ok(Item::Other)
    }
}

/// One token id: a JSON integer in [0, 2**32), written as little-endian u32.
struct IdSeed<'o>(&'o mut Vec<u8>);

impl<'de> DeserializeSeed<'de> for IdSeed<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl Visitor<'_> for IdSeed<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a token id in [0, 2**32)")
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<(), E> {
        let id = u32::try_from(v).map_err(|_| fail("token id"))?;
        self.0.extend_from_slice(&id.to_le_bytes());
        Ok(())
    }
}

/// A completion's `prompt`, rendered into `out` as it is read.
struct Prompt<'o>(&'o mut Vec<u8>);

impl<'de> Visitor<'de> for Prompt<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a prompt")
    }
    fn visit_str<E>(self, s: &str) -> Result<(), E> {
        self.0.extend_from_slice(s.as_bytes());
        Ok(())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let out = self.0;
        match seq.next_element_seed(ItemSeed { out: &mut *out, id_ok: true })? {
            None => {}
            // The first element an id: the whole list is one prompt of ids.
            Some(Item::Id) => while seq.next_element_seed(IdSeed(&mut *out))?.is_some() {},
            // A batch (or a list of one): the prompts joined by BATCH_SEP.
            Some(Item::Other) => loop {
                let mark = out.len();
                out.extend_from_slice(BATCH_SEP);
                if seq.next_element_seed(ItemSeed { out: &mut *out, id_ok: false })?.is_none() {
                    out.truncate(mark);
                    break;
                }
            },
        }
        Ok(())
    }
}

/// Python's `render_completion(prompt)` when the shape is covered; None otherwise.
pub fn render_completion(prompt: &RawValue) -> Option<Vec<u8>> {
    let raw = prompt.get();
    let mut out = Vec::with_capacity(raw.len() + 16);
    let mut de = serde_json::Deserializer::from_str(raw);
    de.deserialize_any(Prompt(&mut out)).ok()?;
    de.end().ok()?;
    Some(out)
}

/// The top-level fields rendering reads (borrowed raw); the rest walked in full.
#[derive(Default)]
struct Top<'a> {
    messages: Option<&'a RawValue>,
    tools: Option<&'a RawValue>,
    prompt: Option<&'a RawValue>,
}

struct TopVisitor {
    chat: bool,
}

impl<'de> Visitor<'de> for TopVisitor {
    type Value = Top<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a request object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Top<'de>, A::Error> {
        let mut top = Top::default();
        while let Some(k) = map.next_key::<Key>()? {
            match k {
                Key::Messages if self.chat => put(&mut top.messages, &mut map, "messages")?,
                Key::Tools if self.chat => put(&mut top.tools, &mut map, "tools")?,
                Key::Prompt if !self.chat => put(&mut top.prompt, &mut map, "prompt")?,
                _ => skip(&mut map)?,
            }
        }
        Ok(top)
    }
}

/// Python's `render_request(orjson.loads(body), chat)` when the body is a JSON object of a
/// covered shape; None for anything else (invalid JSON, duplicate fields read, ...).
pub fn render_body(body: &[u8], chat: bool) -> Option<Vec<u8>> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let top = de.deserialize_map(TopVisitor { chat }).ok()?;
    de.end().ok()?;
    if chat {
        render_chat(top.messages?, top.tools)
    } else {
        render_completion(top.prompt?)
    }
}

/// `render_body` for Python's tests: the bytes, or None when Python must render.
#[pyfunction]
pub fn render_prompt<'py>(py: Python<'py>, body: &[u8], chat: bool) -> Option<Bound<'py, PyBytes>> {
    render_body(body, chat).map(|v| PyBytes::new(py, &v))
}

#[cfg(test)]
#[path = "render_tests.rs"]
mod tests;
