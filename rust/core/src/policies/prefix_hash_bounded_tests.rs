//! Unit tests of `prefix-hash-bounded` through the scorer, as the router runs it.

use super::capacity;
use crate::policies::{build, mix64, Args};
use crate::scorer::{Scorer, ScorerConfig};

const NAME: &str = "prefix-hash-bounded";

fn scorer(factor: Option<f64>) -> Scorer {
    let args = factor.map_or_else(Vec::new, |c| vec![("loadFactor".to_string(), c)]);
    Scorer::new(&ScorerConfig {
        scores: vec![(NAME.into(), 1.0)],
        args: vec![(NAME.into(), Args(args))],
        ..ScorerConfig::default()
    })
    .unwrap()
}

/// A scorer over endpoints with these identities, registered under `ids`.
fn with_endpoints(identities: &[u64], ids: &[u32]) -> Scorer {
    let mut s = scorer(None);
    for (&id, &ident) in ids.iter().zip(identities) {
        s.set_identity(id, ident);
        s.update_metrics(id, 0.0, 0.0, 0.0, f64::NAN, f64::NAN);
    }
    s
}

fn identities(n: u64) -> Vec<u64> {
    (0..n).map(|i| mix64(1000 + i)).collect()
}

/// First choice for `key` (a fresh request hash each call: it must not matter).
fn pick(s: &mut Scorer, key: u64) -> u32 {
    let mut out = Vec::new();
    s.schedule_keyed(mix64(key ^ 0xABCD), Some(key), &[], None, 0, &mut out);
    out[0]
}

#[test]
fn same_key_same_endpoint_in_every_replica() {
    let ident = identities(5);
    // Two "replicas": same endpoints, other ids and registration order.
    let mut a = with_endpoints(&ident, &[0, 1, 2, 3, 4]);
    let mut b = with_endpoints(&ident, &[9, 7, 5, 3, 1]);
    let ident_of_a = |id: u32| ident[id as usize];
    let ident_of_b = |id: u32| ident[[9, 7, 5, 3, 1].iter().position(|&x| x == id).unwrap()];
    for key in 0..500u64 {
        let first = pick(&mut a, key);
        assert_eq!(pick(&mut a, key), first, "key {key} moved between requests");
        assert_eq!(
            ident_of_b(pick(&mut b, key)),
            ident_of_a(first),
            "replicas disagree on {key}"
        );
    }
    // The whole failover order agrees too.
    let (mut oa, mut ob) = (Vec::new(), Vec::new());
    a.schedule_keyed(1, Some(42), &[], None, 0, &mut oa);
    b.schedule_keyed(2, Some(42), &[], None, 0, &mut ob);
    let oa: Vec<u64> = oa.into_iter().map(ident_of_a).collect();
    let ob: Vec<u64> = ob.into_iter().map(ident_of_b).collect();
    assert_eq!(oa, ob);
}

#[test]
fn keys_spread_evenly() {
    let n = 8;
    let mut s = with_endpoints(&identities(n), &(0..n as u32).collect::<Vec<_>>());
    let mut count = vec![0u32; n as usize];
    let keys = 8000u64;
    for key in 0..keys {
        count[pick(&mut s, mix64(key)) as usize] += 1;
    }
    let mean = (keys / n) as f64;
    for &c in &count {
        assert!((f64::from(c) - mean).abs() < 0.15 * mean, "{count:?}");
    }
}

#[test]
fn adding_or_removing_an_endpoint_moves_only_its_share() {
    let ident = identities(11);
    let ids: Vec<u32> = (0..11).collect();
    let mut ten = with_endpoints(&ident[..10], &ids[..10]);
    let mut eleven = with_endpoints(&ident, &ids);
    let keys = 5000u64;
    let mut moved = 0;
    for key in 0..keys {
        let (before, after) = (pick(&mut ten, mix64(key)), pick(&mut eleven, mix64(key)));
        if before != after {
            assert_eq!(after, 10, "key {key} moved between two old endpoints");
            moved += 1;
        }
    }
    let share = f64::from(moved) / keys as f64;
    assert!((share - 1.0 / 11.0).abs() < 0.02, "{share}");
    // Removing endpoint 3: only its keys move.
    let before: Vec<u32> = (0..keys).map(|k| pick(&mut ten, mix64(k))).collect();
    ten.remove_endpoint(3);
    for (k, &b) in before.iter().enumerate() {
        let a = pick(&mut ten, mix64(k as u64));
        assert!(a == b || b == 3, "key {k} moved from {b} to {a}");
        assert_ne!(a, 3);
    }
}

#[test]
fn overloaded_first_choice_spills_to_the_next_in_key_order() {
    let n = 4u32;
    let mut s = with_endpoints(&identities(n.into()), &(0..n).collect::<Vec<_>>());
    let mut order = Vec::new();
    s.schedule_keyed(0, Some(7), &[], None, 0, &mut order);
    // In flight: the key's first choice 3, the others 1 each: total 6, cap ceil(1.25 * 7 / 4) = 3.
    s.add_in_flight(order[0], 3);
    for &id in &order[1..] {
        s.add_in_flight(id, 1);
    }
    let mut got = Vec::new();
    s.schedule_keyed(0, Some(7), &[], None, 0, &mut got);
    assert_eq!(got[0], order[1]);
    assert_eq!(*got.last().unwrap(), order[0]); // over the bound: last resort
    assert_eq!(&got[1..3], &order[2..4]);
    // The others busier (2 each): total 9, cap ceil(1.25 * 10 / 4) = 4, back under the bound.
    for &id in &order[1..] {
        s.add_in_flight(id, 1);
    }
    assert_eq!(pick(&mut s, 7), order[0]);
}

#[test]
fn load_stays_within_the_bound() {
    // One hot key and a few cold ones, requests dispatched and finished at random: every
    // placement goes to an endpoint under ceil(c * (in flight + 1) / n).
    for factor in [1.0, 1.25, 2.0] {
        let n = 5usize;
        let mut s = scorer(Some(factor));
        for id in 0..n as u32 {
            s.set_identity(id, mix64(u64::from(id) + 50));
            s.update_metrics(id, 0.0, 0.0, 0.0, f64::NAN, f64::NAN);
        }
        let mut load = vec![0u64; n];
        let mut rng = 12345u64;
        let mut out = Vec::new();
        for step in 0..4000u64 {
            rng = mix64(rng);
            let finish = rng.is_multiple_of(3) && load.iter().sum::<u64>() > 0;
            if finish {
                let busy: Vec<usize> = (0..n).filter(|&i| load[i] > 0).collect();
                let i = busy[(rng >> 8) as usize % busy.len()];
                load[i] -= 1;
                s.add_in_flight(i as u32, -1);
                continue;
            }
            let key = if rng.is_multiple_of(4) { rng >> 16 } else { 99 }; // 3/4 of requests: one key
            s.schedule_keyed(step, Some(key), &[], None, 0, &mut out);
            let e = out[0] as usize;
            let cap = capacity(factor, load.iter().sum(), n);
            assert!(
                load[e] < cap,
                "factor {factor} step {step}: {load:?} cap {cap} -> {e}"
            );
            load[e] += 1;
            s.add_in_flight(e as u32, 1);
        }
    }
}

#[test]
fn capacity_rounds_up_exactly() {
    assert_eq!(capacity(1.25, 0, 4), 1);
    assert_eq!(capacity(1.25, 7, 4), 3); // 2.5 -> 3
    assert_eq!(capacity(1.0, 7, 4), 2);
    assert_eq!(capacity(1.1, 9, 1), 11); // 1.1 * 10 is 11.000000000000002 in f64
}

#[test]
fn without_a_key_the_request_hash_spreads() {
    let mut s = with_endpoints(&identities(4), &[0, 1, 2, 3]);
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::new();
    for r in 0..64u64 {
        s.schedule(mix64(r), &[], None, 0, &mut out);
        seen.insert(out[0]);
    }
    assert_eq!(seen.len(), 4);
}

#[test]
fn load_factor_is_checked() {
    for bad in [0.99, 0.0, -1.0, 101.0, f64::NAN] {
        let e = build(NAME, &Args(vec![("loadFactor".into(), bad)])).unwrap_err();
        assert!(e.contains("loadFactor must be in [1, 100]"), "{e}");
    }
    let (_, w) = build(NAME, &Args(vec![("prefixKeyBlocks".into(), 4.0)])).unwrap();
    assert!(w.is_empty());
}
