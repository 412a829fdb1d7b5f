//! Unit tests of prefix_traffic.rs.

use super::*;

/// A chain whose key (with key_blocks 2) is `key`.
fn chain(key: u64) -> [u64; 3] {
    [1, key, key + 1_000_000]
}

fn load(t: &mut PrefixTraffic, ids: &[u32]) -> Vec<f64> {
    let mut out = Vec::new();
    t.expected_load(ids, &mut out);
    out
}

#[test]
fn the_key_is_the_chain_hash_at_key_blocks_or_the_last_block() {
    let mut t = PrefixTraffic::new(2);
    t.record(0, &[5, 7, 9]);
    t.record(1, &[6, 7, 8]); // same key (block 2), another endpoint
    t.record(2, &[4]); // shorter than key_blocks: its last block
    t.record(2, &[]); // no block: nothing
    assert_eq!(t.len(), 2);
    let l = load(&mut t, &[0, 1, 2]);
    assert!((l[0] / l[1] - 1.0).abs() < 0.01, "{l:?}"); // one key, split evenly
}

#[test]
fn a_cold_start_splits_by_count_not_by_a_few_requests() {
    // endpoint 1: two prefixes seen once each; then endpoint 0: one prefix seen 3 times in
    // a row. Raw rates would call endpoint 0 the busier (3 in 3 dispatches against 2 in 5);
    // so few requests say little, so each prefix counts as about an average one and
    // endpoint 1 holds more.
    let mut t = PrefixTraffic::new(2);
    for (ep, key) in [(1, 20), (1, 30), (0, 10), (0, 10), (0, 10)] {
        t.record(ep, &chain(key));
    }
    let l = load(&mut t, &[0, 1, 2]);
    assert!(l[1] > l[0] && l[0] > 0.0 && l[2] == 0.0, "{l:?}");
    // relative to the most loaded (1: left out); 2 holds nothing (all 10 blocks)
    let s = t.miss_scores(&[0, 1, 2], 10);
    assert!(s.len() == 2 && s[0].0 == 0 && (1..10).contains(&s[0].1) && s[1] == (2, 10), "{s:?}");
}

#[test]
fn a_measured_hot_prefix_outweighs_a_count_of_cold_ones() {
    // endpoint 0: one prefix with 90 requests; endpoint 1: four prefixes with 3 each
    let mut t = PrefixTraffic::new(2);
    for i in 0..102u64 {
        if i % 17 < 15 {
            t.record(0, &chain(10));
        } else {
            t.record(1, &chain(20 + i % 4));
        }
    }
    for k in 0..4 {
        t.record(1, &chain(20 + k));
    }
    let l = load(&mut t, &[0, 1]);
    assert!(l[0] > 1.5 * l[1], "{l:?}");
    let s = t.miss_scores(&[0, 1], 8);
    assert!(s.len() == 1 && s[0].0 == 1 && s[0].1 >= 2, "{s:?}");
}

#[test]
fn a_replicated_prefix_weighs_on_each_replica_for_its_share() {
    let mut t = PrefixTraffic::new(2);
    for i in 0..40 {
        t.record(if i % 4 == 0 { 1 } else { 0 }, &chain(10)); // 3/4 on 0, 1/4 on 1
    }
    let l = load(&mut t, &[0, 1]);
    let r = l[0] / l[1];
    assert!((r - 3.0).abs() < 0.2, "{l:?}");
}

#[test]
fn old_traffic_decays_and_renormalising_keeps_the_estimate() {
    let mut t = PrefixTraffic::new(2);
    for _ in 0..200 {
        t.record(0, &chain(10));
    }
    // then 3 * WINDOW dispatches of a prefix on endpoint 1 only: 0's key has faded
    for _ in 0..(3.0 * WINDOW) as usize {
        t.record(1, &chain(20));
    }
    let l = load(&mut t, &[0, 1]);
    assert!(l[1] > 10.0 * l[0], "{l:?}");
    // past a renormalisation (RENORMALISE_EVERY dispatches) the rates stay finite and equal
    // for two keys with the same traffic; forgotten keys are dropped
    let mut u = PrefixTraffic::new(2);
    for i in 0..(RENORMALISE_EVERY as usize * 3 + 7) {
        u.record((i % 2) as u32, &chain(100 + (i % 2) as u64));
    }
    let l = load(&mut u, &[0, 1]);
    assert!(l.iter().all(|x| x.is_finite() && *x > 0.0), "{l:?}");
    assert!((l[0] / l[1] - 1.0).abs() < 0.01, "{l:?}");
    for i in 0..RENORMALISE_EVERY as u64 {
        u.record(0, &chain(1000 + i)); // one-off keys
    }
    assert!(u.len() < 3000, "{}", u.len()); // the early one-offs are forgotten
}

#[test]
fn only_the_asked_endpoints_count_and_removed_ones_are_forgotten() {
    let mut t = PrefixTraffic::new(2);
    for _ in 0..50 {
        t.record(7, &chain(99)); // another server's endpoint
    }
    t.record(0, &chain(10));
    t.record(1, &chain(20));
    t.record(1, &chain(30));
    let l = load(&mut t, &[0, 1]);
    assert!(l[1] > l[0], "{l:?}");
    assert_eq!(t.miss_scores(&[3, 4], 10), []); // no traffic there: nothing
    t.remove_endpoint(1);
    assert_eq!(t.len(), 2);
    assert_eq!(t.miss_scores(&[0, 1], 10)[..], [(1, 10)]);
    t.remove_endpoint(0);
    t.remove_endpoint(7);
    assert!(t.is_empty());
}

#[test]
fn a_new_prefix_is_counted_over_its_own_exposure() {
    // endpoint 0: a prefix with 1 request in 10 over the last ~500 dispatches (the rest go
    // to another server's endpoint); endpoint 1: a prefix just arrived, 10 requests in a row.
    // The newcomer has the fewer requests but the higher rate.
    let mut t = PrefixTraffic::new(2);
    for i in 0..500u64 {
        if i % 10 == 0 {
            t.record(0, &chain(10));
        } else {
            t.record(5, &chain(1_000 + i));
        }
    }
    for _ in 0..10 {
        t.record(1, &chain(20));
    }
    let l = load(&mut t, &[0, 1]);
    assert!(l[1] > 1.5 * l[0], "{l:?}");
}
