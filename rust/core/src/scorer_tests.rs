//! Unit tests of the scorer (kept apart so scorer.rs holds only the pipeline).

use super::*;

fn cfg(filters: &[&str], scores: &[(&str, f64)]) -> ScorerConfig {
    ScorerConfig {
        filters: filters.iter().map(|s| s.to_string()).collect(),
        scores: scores.iter().map(|&(s, w)| (s.to_string(), w)).collect(),
        ..ScorerConfig::default()
    }
}

fn scorer(c: &ScorerConfig, n: u32) -> Scorer {
    let mut s = Scorer::new(c).unwrap();
    for id in 0..n {
        s.update_metrics(id, 0.0, 0.0, 0.0, 0.1, 0.01);
    }
    s
}

fn sched(s: &mut Scorer, req: u64, m: &[(u32, u32)], lora: Option<u32>, total: u32) -> Vec<u32> {
    let mut out = Vec::new();
    s.schedule(req, m, lora, total, &mut out);
    out
}

#[test]
fn config_errors() {
    assert!(Scorer::new(&cfg(&["gpu-usage"], &[]))
        .unwrap_err()
        .contains("not a filter"));
    assert!(Scorer::new(&cfg(&[], &[("nope", 1.0)])).is_err());
    assert!(Scorer::new(&cfg(&[], &[("random", -1.0)])).is_err());
    let mut c = cfg(&[], &[("gpu-usage", 1.0)]);
    c.args = vec![
        ("gpu-usage".into(), Args(vec![("x".into(), 1.0)])),
        ("least-latency".into(), Args(vec![("y".into(), 1.0)])),
    ];
    assert_eq!(Scorer::new(&c).unwrap().warnings().len(), 1); // unused plugin: silent
}

#[test]
fn weighted_combination_orders_candidates() {
    let c = cfg(&[], &[("prefix-cache", 2.0), ("gpu-usage", 1.0)]);
    let mut s = scorer(&c, 3);
    s.update_metrics(0, 0.0, 0.0, 0.9, f64::NAN, f64::NAN);
    s.update_metrics(1, 0.0, 0.0, 0.0, f64::NAN, f64::NAN);
    s.update_metrics(2, 0.0, 0.0, 0.5, f64::NAN, f64::NAN);
    // 0: (2*1.0 + 0.1)/3 = 0.70; 1: (0 + 1)/3 = 0.33; 2: (2*0.5 + 0.5)/3 = 0.5
    assert_eq!(sched(&mut s, 1, &[(0, 8), (2, 4)], None, 8), [0, 2, 1]);
    // Without matches usage decides; unknown ids in the matches are ignored.
    assert_eq!(sched(&mut s, 1, &[(99, 8)], None, 8), [1, 2, 0]);
}

#[test]
fn ties_broken_by_request_hash() {
    let c = cfg(&[], &[("prefix-cache", 1.0)]);
    let mut s = scorer(&c, 8);
    let firsts: std::collections::HashSet<u32> =
        (0..64).map(|r| sched(&mut s, r, &[], None, 4)[0]).collect();
    assert!(firsts.len() >= 6, "{firsts:?}");
    assert_eq!(
        sched(&mut s, 5, &[], None, 4),
        sched(&mut s, 5, &[], None, 4)
    );
}

#[test]
fn round_robin_cycles_through_all() {
    let mut s = scorer(&cfg(&[], &[("round-robin", 1.0)]), 3);
    let firsts: Vec<u32> = (0..6).map(|r| sched(&mut s, r, &[], None, 0)[0]).collect();
    assert_eq!(firsts, [0, 1, 2, 0, 1, 2]);
}

#[test]
fn filters_and_their_fallback() {
    let c = cfg(
        &["least-request", "lora-affinity"],
        &[("least-request", 1.0)],
    );
    let mut s = scorer(&c, 3);
    s.update_metrics(0, 1.0, 20.0, 0.0, f64::NAN, f64::NAN);
    s.set_loras(1, &[7], 4);
    s.set_loras(2, &[], 4);
    assert_eq!(sched(&mut s, 1, &[], Some(7), 0), [1]);
    assert_eq!(sched(&mut s, 1, &[], None, 0).len(), 2); // endpoint 0 waits too much
    s.update_metrics(1, 1.0, 20.0, 0.0, f64::NAN, f64::NAN);
    s.update_metrics(2, 1.0, 20.0, 0.0, f64::NAN, f64::NAN);
    // Everyone over maxWaitingRequests: the filter is undone, not an outage.
    assert_eq!(sched(&mut s, 1, &[], None, 0).len(), 3);
}

#[test]
fn stale_is_never_idle() {
    let mut s = scorer(&cfg(&[], &[("least-request", 1.0)]), 3);
    s.update_metrics(0, 10.0, 5.0, 0.0, f64::NAN, f64::NAN);
    s.update_metrics(1, 12.0, 5.0, 0.0, f64::NAN, f64::NAN);
    s.mark_stale(2); // it was idle at its last scrape
    assert_eq!(sched(&mut s, 3, &[], None, 0), [0, 1, 2]);
    s.add_endpoint(9); // never scraped: stale too
    let v = sched(&mut s, 3, &[], None, 0);
    assert_eq!(&v[..2], [0, 1]);
    assert!(v[2..] == [2, 9] || v[2..] == [9, 2]);
}

#[test]
fn in_flight_reacts_between_scrapes() {
    let mut s = scorer(&cfg(&[], &[("least-request", 1.0)]), 2);
    s.update_metrics(0, 3.0, 0.0, 0.0, f64::NAN, f64::NAN);
    s.update_metrics(1, 4.0, 0.0, 0.0, f64::NAN, f64::NAN);
    assert_eq!(sched(&mut s, 1, &[], None, 0)[0], 0);
    s.add_in_flight(0, 2);
    assert_eq!(sched(&mut s, 1, &[], None, 0)[0], 1);
    // The next scrape sees our two requests: they are not counted twice.
    s.update_metrics(0, 5.0, 0.0, 0.0, f64::NAN, f64::NAN);
    assert_eq!(s.signals(0).unwrap().load(), 5.0);
    s.add_in_flight(0, -2);
    assert_eq!(s.signals(0).unwrap().load(), 3.0);
}

#[test]
fn other_workers_dispatches_count_until_the_next_scrape() {
    let mut s = scorer(&cfg(&[], &[("least-request", 1.0)]), 2);
    s.update_metrics(0, 3.0, 0.0, 0.0, f64::NAN, f64::NAN);
    s.update_metrics(1, 4.0, 0.0, 0.0, f64::NAN, f64::NAN);
    s.add_remote_in_flight(0, 2); // another worker sent two there
    assert_eq!(s.signals(0).unwrap().load(), 5.0);
    assert_eq!(sched(&mut s, 1, &[], None, 0)[0], 1);
    s.add_remote_in_flight(0, -1); // one of them finished
    assert_eq!(s.signals(0).unwrap().load(), 4.0);
    // The scrape sees the one still running: not counted twice.
    s.update_metrics(0, 4.0, 0.0, 0.0, f64::NAN, f64::NAN);
    assert_eq!(s.signals(0).unwrap().load(), 4.0);
    assert_eq!(s.signals(0).unwrap().remote_in_flight, 1); // still in flight: a count, not a delta
    s.add_remote_in_flight(0, -1); // it finishes after the scrape
    assert_eq!(s.signals(0).unwrap().load(), 3.0);
    assert_eq!(s.signals(0).unwrap().remote_in_flight, 0);
}

fn guard_setup(abs: f64, rel: f64) -> Scorer {
    let mut c = cfg(&[], &[("prefix-cache", 3.0), ("least-request", 1.0)]);
    c.hot_spot_abs = abs;
    c.hot_spot_rel = rel;
    scorer(&c, 3)
}

/// Running requests per endpoint id, nothing waiting.
fn set_running(s: &mut Scorer, running: &[f64]) {
    for (id, &r) in (0u32..).zip(running) {
        s.update_metrics(id, r, 0.0, 0.0, f64::NAN, f64::NAN);
    }
}

#[test]
fn hot_spot_guard_load_wins() {
    let mut s = guard_setup(8.0, 2.0);
    set_running(&mut s, &[30.0, 5.0, 6.0]);
    // Endpoint 0 holds the whole prefix but is 25 requests / 6x above the least loaded.
    assert_eq!(sched(&mut s, 1, &[(0, 10)], None, 10), [1, 2, 0]);
    assert_eq!(s.hot_spot_count(), 1);
    // Below the absolute threshold: affinity wins.
    s.update_metrics(0, 12.0, 0.0, 0.0, f64::NAN, f64::NAN);
    assert_eq!(sched(&mut s, 1, &[(0, 10)], None, 10)[0], 0);
    assert_eq!(s.hot_spot_count(), 1);
}

#[test]
fn hot_spot_guard_moves_to_the_best_endpoint_that_is_not_hot() {
    let mut s = guard_setup(8.0, 2.0);
    set_running(&mut s, &[30.0, 10.0, 5.0]);
    // 0 holds the whole prefix and is a hot spot; 1 holds most of it and is busier than 2
    // but not hot: the request goes to the replica on 1, not to the idlest endpoint.
    let m = [(0, 10), (1, 6)];
    assert_eq!(sched(&mut s, 1, &m, None, 10), [1, 2, 0]);
    assert_eq!(s.hot_spot_count(), 1);
    // Two hot spots (both > 8 above and > 2x the least loaded) go last, by score.
    s.update_metrics(1, 20.0, 0.0, 0.0, f64::NAN, f64::NAN);
    assert_eq!(sched(&mut s, 1, &m, None, 10), [2, 0, 1]);
    assert_eq!(s.hot_spot_count(), 2);
}

#[test]
fn hot_spot_guard_relative_threshold_and_stale_top() {
    let mut s = guard_setup(8.0, 3.0);
    s.update_metrics(0, 40.0, 0.0, 0.0, f64::NAN, f64::NAN);
    s.update_metrics(1, 20.0, 0.0, 0.0, f64::NAN, f64::NAN);
    s.update_metrics(2, 25.0, 0.0, 0.0, f64::NAN, f64::NAN);
    // 40 - 20 > 8 but 40 < 3 * 20: affinity keeps it.
    assert_eq!(sched(&mut s, 1, &[(0, 10)], None, 10)[0], 0);
    assert_eq!(s.hot_spot_count(), 0);
    // A stale best match is overloaded by definition.
    s.mark_stale(0);
    assert_eq!(sched(&mut s, 1, &[(0, 10)], None, 10), [1, 2, 0]);
    // Disabled guard: affinity keeps even the stale endpoint first.
    let mut s = guard_setup(f64::INFINITY, 3.0);
    s.mark_stale(0);
    assert_eq!(sched(&mut s, 1, &[(0, 10)], None, 10)[0], 0);
}

#[test]
fn guard_inactive_without_affinity_policy() {
    let mut c = cfg(&[], &[("random", 1.0)]);
    c.hot_spot_abs = 0.0;
    c.hot_spot_rel = 1.0;
    let mut s = scorer(&c, 4);
    s.update_metrics(0, 100.0, 0.0, 0.0, f64::NAN, f64::NAN);
    for r in 0..50 {
        sched(&mut s, r, &[], None, 0);
    }
    assert_eq!(s.hot_spot_count(), 0);
}

#[test]
fn max_candidates_and_removal() {
    let mut c = cfg(&[], &[("least-request", 1.0)]);
    c.max_candidates = 2;
    let mut s = scorer(&c, 5);
    for id in 0..5 {
        s.update_metrics(id, f64::from(5 - id), 0.0, 0.0, f64::NAN, f64::NAN);
    }
    assert_eq!(sched(&mut s, 1, &[], None, 0), [4, 3]);
    assert!(s.remove_endpoint(4));
    assert!(!s.remove_endpoint(4));
    assert_eq!(sched(&mut s, 1, &[], None, 0), [3, 2]);
    assert_eq!(s.endpoints(), [0, 1, 2, 3]);
    s.add_endpoint(10); // reuses the slot, starts stale
    assert!(s.signals(10).unwrap().stale);
    assert_eq!(sched(&mut s, 1, &[], None, 0), [3, 2]);
}

#[test]
fn latency_observations_blend() {
    let mut s = scorer(&cfg(&[], &[("least-latency", 1.0)]), 2);
    s.update_metrics(0, 0.0, 0.0, 0.0, 1.0, f64::NAN);
    s.observe_latency(0, 2.0, f64::NAN);
    assert!((s.signals(0).unwrap().ttft_s - 1.2).abs() < 1e-12);
    s.update_metrics(0, 0.0, 0.0, 0.0, f64::NAN, f64::NAN); // no sample: kept
    assert!((s.signals(0).unwrap().ttft_s - 1.2).abs() < 1e-12);
}

#[test]
fn all_plugins_large_pool_is_a_permutation() {
    let c = cfg(
        &["least-request", "lora-affinity"],
        &[
            ("random", 1.0),
            ("round-robin", 1.0),
            ("least-request", 1.0),
            ("least-latency", 1.0),
            ("gpu-usage", 1.0),
            ("prefix-cache", 1.0),
            ("kvcache-aware", 1.0),
            ("lora-affinity", 1.0),
        ],
    );
    let mut s = scorer(&c, 1000);
    let m: Vec<(u32, u32)> = (0..1000).step_by(7).map(|i| (i, i % 13)).collect();
    let mut v = sched(&mut s, 42, &m, Some(3), 12);
    v.sort_unstable();
    assert_eq!(v, (0..1000).collect::<Vec<_>>());
}

#[test]
fn relayed_adapter_counts_are_kept_apart_reconciled_and_cleared() {
    let mut s = Scorer::new(&ScorerConfig::default()).unwrap();
    s.add_endpoint(1);
    s.add_endpoint(2);
    s.add_lora_in_flight(1, 7, 1);
    s.add_remote_lora_in_flight(1, 7, 2);
    s.add_remote_lora_in_flight(1, 8, 1);
    s.add_remote_lora_in_flight(2, 8, 1);
    s.add_remote_lora_in_flight(1, 9, -1); // a completion without its start: ignored
    let e = s.signals(1).unwrap();
    assert_eq!((e.lora_in_flight.clone(), e.lora_in_flight_of(7), e.lora_active()), (vec![(7, 1)], 3, 2));
    s.add_lora_in_flight(1, 7, -1); // our own ended: the siblings' stay
    assert_eq!(s.signals(1).unwrap().lora_in_flight_of(7), 2);
    s.retain_remote_loras(1, &[7]); // the engine no longer lists 8: a lost completion
    assert_eq!(s.signals(1).unwrap().lora_remote, vec![(7, 2)]);
    s.clear_remote_loras();
    assert!(s.signals(1).unwrap().lora_remote.is_empty() && s.signals(2).unwrap().lora_remote.is_empty());
}
