//! Unit tests of table.rs: body checks, header block, attempts, balanced misses.

use super::*;

#[test]
fn body_facts_follow_parse_body() {
    let f = |b: &str, chat| body_facts(b.as_bytes(), chat).map(|x| (x.model, x.stream, x.inject));
    assert_eq!(f(r#"{"model":"m","messages":[]}"#, true), Some(("m".into(), false, false)));
    assert_eq!(f(r#"{"model":"m","messages":[],"stream":true}"#, true), Some(("m".into(), true, true)));
    assert_eq!(
        f(r#"{"model":"m","messages":[],"stream":true,"stream_options":{"include_usage":true}}"#, true),
        Some(("m".into(), true, false))
    );
    assert_eq!(f(r#"{"model":"m","messages":[],"stream":true,"stream_options":{}}"#, true), None);
    assert_eq!(f(r#"{"model":"m","messages":[],"stream":true,"stream_options":null}"#, true), Some(("m".into(), true, true)));
    assert_eq!(f(r#"{"model":"m","prompt":"x","max_tokens":5}"#, false), Some(("m".into(), false, false)));
    assert_eq!(f(r#"{"model":"m","prompt":"x","max_tokens":5.0}"#, false), None);
    assert_eq!(f(r#"{"model":"m","prompt":3}"#, false), None);
    assert_eq!(f(r#"{"model":"m","model":"n","messages":[]}"#, true), None); // orjson: last wins
    assert_eq!(f(r#"{"model":"","messages":[]}"#, true), None);
    assert_eq!(f(r#"{"model":"m","messages":{}}"#, true), None);
    assert_eq!(f(r#"["m"]"#, true), None);
    assert_eq!(f(r#"{"model":"m","messages":[],"stream":1}"#, true), None);
    assert_eq!(f(r#"{"model":"m","messages":[]"#, true), None);
    // what orjson refuses is declined too
    assert_eq!(f(r#"{"model":"m","messages":[],"x":"\ud800"}"#, true), None);
    assert_eq!(f(r#"{"model":"m","messages":["\udc00x"]}"#, true), None);
    assert_eq!(f(r#"{"model":"m","messages":[],"x":1e999}"#, true), None);
    assert_eq!(f(r#"{"model":"m","messages":[[1E400]]}"#, true), None);
    let deep = format!(r#"{{"model":"m","messages":[],"x":{}{}}}"#, "[".repeat(1100), "]".repeat(1100));
    assert_eq!(f(&deep, true), None);
    let ok = format!(r#"{{"model":"m","messages":[],"x":{}{}}}"#, "[".repeat(100), "]".repeat(100));
    assert!(f(&ok, true).is_some());
    assert!(f(r#"{"model":"m","messages":[],"x":"\ud83d\ude00","y":1e300}"#, true).is_some());
}

#[test]
fn headers_follow_request_headers() {
    let ids = Ids::default();
    let mut h = HeaderMap::new();
    h.append("content-type", HeaderValue::from_static("application/json"));
    h.append("connection", HeaderValue::from_static("x-hop, Keep-Alive"));
    h.append("x-hop", HeaderValue::from_static("1"));
    h.append("authorization", HeaderValue::from_static("Bearer k"));
    h.append("x-request-id", HeaderValue::from_static("abc"));
    h.append("x-kept", HeaderValue::from_static("2"));
    let (out, rid) = upstream_headers(&h, &ids).unwrap();
    assert_eq!(rid, "abc");
    let names: Vec<&str> = out.keys().map(|k| k.as_str()).collect();
    assert_eq!(names, ["content-type", "x-kept", "x-request-id", "accept-encoding"]);
    h.append("content-encoding", HeaderValue::from_static("gzip"));
    assert!(upstream_headers(&h, &ids).is_none());
    let mut g = HeaderMap::new();
    g.append("x-request-id", HeaderValue::from_static("bad\tid"));
    let (_, rid) = upstream_headers(&g, &ids).unwrap();
    assert_eq!(rid.len(), 32);
}

#[test]
fn balanced_misses_come_from_the_index_traffic() {
    // the front calls the index's miss_scores, as scheduler.py does
    let mut index = PrefixIndex::with_hints(100, 0);
    index.track_traffic(2);
    index.insert(1, &[1, 11, 12]);
    index.insert(1, &[1, 21, 22]);
    index.insert(2, &[1, 31]);
    let s = index.miss_scores(&[1, 2, 3], 10);
    assert!(s.len() == 2 && s[0].0 == 2 && (1..10).contains(&s[0].1) && s[1] == (3, 10), "{s:?}");
    assert_eq!(index.miss_scores(&[4, 5], 10), []); // no traffic there: nothing
}

#[test]
fn rotation_and_attempts() {
    let s = Server::new(vec!["a".into(), "b".into(), "c".into()], vec![HeaderValue::from_static("a"); 3], None, 2,
                        Vec::new(), (Duration::ZERO, None, None, None, None, Duration::ZERO, Duration::ZERO), 0, None, Default::default());
    assert_eq!(s.order(), [0, 1]);
    assert_eq!(s.order(), [1, 2]);
    assert_eq!(s.order(), [2, 0]);
    let r = Server::new(vec!["a".into()], vec![HeaderValue::from_static("a")], Some(2), 2, Vec::new(),
                        (Duration::ZERO, None, None, None, None, Duration::ZERO, Duration::ZERO), 0, None, Default::default());
    assert_eq!(r.order(), [0, 0, 0]);
    // ranked attempts: fallbacks appended past the ranking, cycling
    assert_eq!(r.attempts(vec![0]), [0, 0, 0]);
    let f = Server::new(vec!["a".into(), "b".into(), "c".into()], vec![HeaderValue::from_static("a"); 3], Some(3), 2,
                        Vec::new(), (Duration::ZERO, None, None, None, None, Duration::ZERO, Duration::ZERO), 0, None, Default::default());
    assert_eq!(f.attempts(vec![2]), [2, 0, 1, 2]);
    assert_eq!(s.attempts(vec![2, 1, 0]), [2, 1]);
    assert_eq!(s.attempts(vec![1]), [1]);
}

#[test]
fn rotation_shared_with_python_and_across_installs() {
    let shared = Arc::new(AtomicUsize::new(0));
    let make = || Server::new(vec!["a".into(), "b".into()], vec![HeaderValue::from_static("a"); 2], Some(0), 2,
                              Vec::new(), (Duration::ZERO, None, None, None, None, Duration::ZERO, Duration::ZERO), 0,
                              None, shared.clone());
    let first = make();
    assert_eq!(first.order(), [0]);
    assert_eq!(crate::rotation::start(&shared, 2), 1); // Python's balancer decided one
    assert_eq!(first.order(), [0]);
    let reinstalled = make(); // a reload: the rotation goes on where it was
    assert_eq!(reinstalled.order(), [1]);
    assert_eq!(crate::rotation::start(&shared, 1), 0); // no choice: no step
    assert_eq!(reinstalled.order(), [0]);
}
