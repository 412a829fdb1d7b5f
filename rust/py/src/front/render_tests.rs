//! Unit tests of render.rs: each covered shape (bytes as kthena_router/scheduling/render.py
//! gives them) and each decline. tests/unit/test_render_parity.py checks parity with Python.

use super::*;

fn chat(body: &str) -> Option<Vec<u8>> {
    render_body(body.as_bytes(), true)
}

fn completion(body: &str) -> Option<Vec<u8>> {
    render_body(body.as_bytes(), false)
}

fn msgs(messages: &str) -> Option<Vec<u8>> {
    chat(&format!(r#"{{"model":"m","messages":{messages}}}"#))
}

fn prompt(p: &str) -> Option<Vec<u8>> {
    completion(&format!(r#"{{"model":"m","prompt":{p}}}"#))
}

fn ids(list: &[u32]) -> Vec<u8> {
    let mut v = IDS_MARK.to_vec();
    for i in list {
        v.extend_from_slice(&i.to_le_bytes());
    }
    v
}

#[test]
fn chat_strings_and_null_content() {
    assert_eq!(msgs("[]").unwrap(), b"");
    assert_eq!(
        msgs(r#"[{"role":"system","content":"be brief"},{"content":"hi","role":"user","extra":{"a":[1,2.5,null]}}]"#).unwrap(),
        b"<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
    );
    assert_eq!(msgs(r#"[{"role":"assistant"}]"#).unwrap(), b"<|im_start|>assistant\n<|im_end|>\n");
    assert_eq!(msgs(r#"[{"role":"assistant","content":null,"tool_calls":null}]"#).unwrap(), b"<|im_start|>assistant\n<|im_end|>\n");
    assert_eq!(msgs(r#"[{"role":"","content":""}]"#).unwrap(), b"<|im_start|>\n<|im_end|>\n");
}

#[test]
fn chat_name_and_tool_call_id() {
    assert_eq!(
        msgs(r#"[{"role":"tool","tool_call_id":"c1","name":"f","content":"42"}]"#).unwrap(),
        b"<|im_start|>tool name=f tool_call_id=c1\n42<|im_end|>\n"
    );
    assert_eq!(msgs(r#"[{"role":"user","name":null,"tool_call_id":null,"content":"x"}]"#).unwrap(), b"<|im_start|>user\nx<|im_end|>\n");
    assert_eq!(msgs(r#"[{"role":"user","name":"","content":"x"}]"#).unwrap(), b"<|im_start|>user name=\nx<|im_end|>\n");
}

#[test]
fn chat_escapes_are_decoded() {
    assert_eq!(
        msgs(r#"[{"r\u006fle":"u\ns\"r","content":"\u00e9\ud83d\ude00\u0000\/"}]"#).unwrap(),
        "<|im_start|>u\ns\"r\n\u{e9}\u{1f600}\u{0}/<|im_end|>\n".as_bytes()
    );
}

#[test]
fn chat_parts() {
    assert_eq!(
        msgs(concat!(
            r#"[{"role":"user","content":[{"type":"text","text":"a"},{"text":"b","type":"input_text"},"#,
            r#"{"type":"output_text","text":"c","annotations":[]},{"type":"image_url","image_url":{"url":"data:x","detail":"low"}},"#,
            r#"{"type":"image_url","image_url":"http://i"},{"type":"text","text":"d","image_url":5},"#,
            r#"{"type":"image_url","image_url":""}]}]"#
        ))
        .unwrap(),
        b"<|im_start|>user\nabc<|image|>data:x<|/image|><|image|>http://i<|/image|>d<|image|><|/image|><|im_end|>\n"
    );
    assert_eq!(msgs(r#"[{"role":"user","content":[]}]"#).unwrap(), b"<|im_start|>user\n<|im_end|>\n");
}

#[test]
fn chat_falsy_tools_are_skipped() {
    for tools in ["null", "[]", "[ ]", "{}", "\"\"", "false", "0"] {
        assert_eq!(
            chat(&format!(r#"{{"tools":{tools},"messages":[{{"role":"u","content":"x"}}]}}"#)).unwrap(),
            b"<|im_start|>u\nx<|im_end|>\n",
            "{tools}"
        );
    }
    assert_eq!(chat(r#"{"messages":[],"prompt":"ignored"}"#).unwrap(), b"");
}

#[test]
fn chat_declines() {
    for m in [
        r#"{"role":"u"}"#,                                          // not a list
        r#"null"#,                                                  // not a list
        r#"["x"]"#,                                                 // message not an object
        r#"[{"content":"x"}]"#,                                     // no role
        r#"[{"role":null}]"#,                                       // role null
        r#"[{"role":1}]"#,                                          // role not a string
        r#"[{"role":"u","name":1}]"#,                               // name not a string
        r#"[{"role":"u","tool_call_id":true}]"#,                    // id not a string
        r#"[{"role":"u","content":1}]"#,                            // content a number
        r#"[{"role":"u","content":{"a":1}}]"#,                      // content an object
        r#"[{"role":"u","content":["x"]}]"#,                        // part not an object
        r#"[{"role":"u","content":[{"type":"text"}]}]"#,            // no text
        r#"[{"role":"u","content":[{"type":"text","text":1}]}]"#,   // text not a string
        r#"[{"role":"u","content":[{"type":"refusal","text":"x"}]}]"#, // other part type
        r#"[{"role":"u","content":[{"text":"x"}]}]"#,               // no type
        r#"[{"role":"u","content":[{"type":1,"text":"x"}]}]"#,      // type not a string
        r#"[{"role":"u","content":[{"type":"image_url"}]}]"#,       // no image_url
        r#"[{"role":"u","content":[{"type":"image_url","image_url":null}]}]"#,
        r#"[{"role":"u","content":[{"type":"image_url","image_url":{"uri":"x"}}]}]"#,
        r#"[{"role":"u","content":[{"type":"image_url","image_url":{"url":1}}]}]"#,
        r#"[{"role":"u","tool_calls":[]}]"#,                        // tool calls: Python's own
        r#"[{"role":"u","tool_calls":{}}]"#,
        r#"[{"role":"u","role":"v"}]"#,                             // duplicate keys read
        r#"[{"role":"u","content":"a","content":"b"}]"#,
        r#"[{"role":"u","name":"a","name":"a"}]"#,
        r#"[{"role":"u","tool_call_id":"a","tool_call_id":null}]"#,
        r#"[{"role":"u","tool_calls":null,"tool_calls":null}]"#,
        r#"[{"role":"u","content":[{"type":"text","type":"text","text":"x"}]}]"#,
        r#"[{"role":"u","content":[{"type":"text","text":"x","text":"y"}]}]"#,
        r#"[{"role":"u","content":[{"type":"image_url","image_url":{"url":"a","url":"b"}}]}]"#,
        r#"[{"role":"u","x":"\ud800"}]"#,                           // lone surrogate (orjson refuses)
        r#"[{"role":"u","x":1e400}]"#,                              // out of a double's range
        r#"[{"role":"u"},]"#,                                       // invalid JSON
    ] {
        assert_eq!(msgs(m), None, "{m}");
    }
    for tools in ["[{}]", "{\"a\":1}", "1", "true", "\"x\""] {
        assert_eq!(chat(&format!(r#"{{"tools":{tools},"messages":[]}}"#)), None, "{tools}");
    }
}

#[test]
fn body_declines() {
    for b in [
        r#"{"model":"m"}"#,                              // no messages
        r#"{"messages":[],"messages":[]}"#,              // duplicate read field
        r#"{"messages":[],"tools":null,"tools":null}"#,
        r#"{"messages":[],"x":"\udc00"}"#,               // the rest is checked too
        r#"{"messages":[],"prompt":"\ud800"}"#,
        r#"{"messages":[]} x"#,                          // trailing data
        r#"[]"#,
        r#""#,
    ] {
        assert_eq!(chat(b), None, "{b}");
    }
    assert_eq!(render_body(b"{\"messages\":[],\"x\":\"\xff\"}", true), None); // invalid UTF-8
    assert_eq!(render_body(b"{\"prompt\":\"a\",\"x\":\"\xff\"}", false), None);
    assert_eq!(chat(r#"{"messages":[],"model":"a","model":"b"}"#).unwrap(), b""); // unread duplicate
    assert_eq!(completion(r#"{"prompt":"a","prompt":"a"}"#), None);
    assert_eq!(completion(r#"{"messages":[]}"#), None);
}

#[test]
fn completion_prompts() {
    assert_eq!(prompt(r#""hello\nw\u00f6rld""#).unwrap(), "hello\nw\u{f6}rld".as_bytes());
    assert_eq!(prompt(r#""""#).unwrap(), b"");
    assert_eq!(prompt("[]").unwrap(), b"");
    assert_eq!(prompt("[1, 2, 4294967295, 0]").unwrap(), ids(&[1, 2, u32::MAX, 0]));
    assert_eq!(prompt(r#"["one"]"#).unwrap(), b"one");
    assert_eq!(prompt("[[7]]").unwrap(), ids(&[7]));
    assert_eq!(prompt("[[]]").unwrap(), ids(&[]));
    let mut batch = b"a\x00\n".to_vec();
    batch.extend(ids(&[5, 6]));
    batch.extend(b"\x00\n\x00\n");
    batch.extend(ids(&[]));
    assert_eq!(prompt(r#"["a",[5,6],"",[]]"#).unwrap(), batch);
}

#[test]
fn completion_declines() {
    for p in [
        "null", "1", "true", "{}", "[4294967296]", "[-1]", "[-0]", "[1.0]", "[1e2]", "[1,2.0]", "[true]", "[1,true]",
        r#"[1,"a"]"#, "[1,[2]]", r#"["a",1]"#, r#"[["a"]]"#, "[[1.5]]", "[[-1]]", r#"[null]"#, r#"["a",null]"#,
        "[18446744073709551616]", r#"[{"a":1}]"#, r#"["\ud800"]"#,
    ] {
        assert_eq!(prompt(p), None, "{p}");
    }
}

#[test]
fn direct_entry_points() {
    let raw = |s: &str| RawValue::from_string(s.to_owned()).unwrap();
    assert_eq!(render_chat(&raw(r#"[{"role":"u","content":"x"}]"#), None).unwrap(), b"<|im_start|>u\nx<|im_end|>\n");
    assert_eq!(render_chat(&raw("[]"), Some(&raw("[1]"))), None);
    assert_eq!(render_completion(&raw("[3]")).unwrap(), ids(&[3]));
}
