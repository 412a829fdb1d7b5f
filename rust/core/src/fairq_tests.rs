//! Unit tests of the fair queue (ordering, VTC counters, bounds, cancellation).

use super::*;

fn class(order: u32, weight: f64, max_len: u32) -> ClassSpec {
    ClassSpec {
        order,
        weight,
        max_len,
    }
}

fn one_class() -> FairQueue {
    FairQueue::new(vec![class(0, 1.0, 100_000)], CostModel::default()).unwrap()
}

fn enq(q: &mut FairQueue, class: u32, tenant: u32, weight: f64, input: u32) -> u64 {
    q.enqueue(class, tenant, weight, input, 0)
        .unwrap()
        .expect("room in the class")
}

/// Serve `rounds` requests with `slots` running at a time, one output token per step;
/// every tenant keeps `backlog` requests queued. Returns the tokens served per tenant.
fn serve(q: &mut FairQueue, tenants: &[(u32, f64, u32, u64)], rounds: usize) -> HashMap<u32, f64> {
    // (tenant, weight, input tokens, output tokens) per request
    let mut served: HashMap<u32, f64> = HashMap::new();
    for &(t, w, inp, _) in tenants {
        for _ in 0..4 {
            enq(q, 0, t, w, inp);
        }
    }
    for _ in 0..rounds {
        let (_, c, t) = q.dequeue(0).expect("backlogged");
        let &(_, w, inp, out) = tenants.iter().find(|x| x.0 == t).unwrap();
        q.settle(c, t, 0, out, 0).unwrap();
        *served.entry(t).or_default() += inp as f64 + out as f64;
        enq(q, 0, t, w, inp); // kept backlogged
    }
    served
}

#[test]
fn config_errors() {
    assert!(FairQueue::new(vec![], CostModel::default()).is_err());
    assert!(FairQueue::new(vec![class(0, 0.0, 1)], CostModel::default()).is_err());
    let bad = CostModel {
        output: f64::NAN,
        ..CostModel::default()
    };
    assert!(FairQueue::new(vec![class(0, 1.0, 1)], bad).is_err());
    let mut q = one_class();
    assert!(q.enqueue(3, 1, 1.0, 0, 0).is_err());
    assert!(q.enqueue(0, 1, 0.0, 0, 0).is_err());
}

#[test]
fn fifo_within_a_tenant() {
    let mut q = one_class();
    let a = enq(&mut q, 0, 7, 1.0, 10);
    let b = enq(&mut q, 0, 7, 1.0, 10);
    let c = enq(&mut q, 0, 7, 1.0, 10);
    assert_eq!(q.len(), 3);
    assert_eq!(q.dequeue(0).unwrap().0, a);
    assert_eq!(q.dequeue(0).unwrap().0, b);
    assert_eq!(q.dequeue(0).unwrap().0, c);
    assert!(q.dequeue(0).is_none());
    assert!(q.is_empty());
}

#[test]
fn lower_order_level_always_first() {
    let mut q = FairQueue::new(
        vec![class(5, 1.0, 10), class(1, 1.0, 10)],
        CostModel::default(),
    )
    .unwrap();
    let low = enq(&mut q, 0, 1, 1.0, 1);
    // the high class's tenant has a huge counter: the level still wins
    q.admit(1, 2, 1.0, 1_000_000, 0).unwrap();
    let high = enq(&mut q, 1, 2, 1.0, 1);
    assert_eq!(q.dequeue(0).unwrap(), (high, 1, 2));
    assert_eq!(q.dequeue(0).unwrap(), (low, 0, 1));
}

#[test]
fn equal_weights_share_tokens_not_requests() {
    let mut q = one_class();
    // tenant 1: big requests (10 in + 100 out), tenant 2: small (10 in + 10 out)
    let served = serve(&mut q, &[(1, 1.0, 10, 100), (2, 1.0, 10, 10)], 3000);
    let (a, b) = (served[&1], served[&2]);
    // cost weights in 1, out 2: weighted costs 210 vs 30 per request; served tokens by cost
    // are equal, so raw token shares follow 110/210 and 20/30
    let wa = a / 110.0 * 210.0;
    let wb = b / 20.0 * 30.0;
    assert!((wa / wb - 1.0).abs() < 0.05, "weighted shares {wa} vs {wb}");
}

#[test]
fn tenant_weights_split_service() {
    let mut q = one_class();
    let served = serve(&mut q, &[(1, 3.0, 0, 50), (2, 1.0, 0, 50)], 4000);
    let share = served[&1] / (served[&1] + served[&2]);
    assert!(
        (share - 0.75).abs() < 0.02,
        "share of the weight-3 tenant: {share}"
    );
}

#[test]
fn newcomer_is_lifted_and_does_not_starve_others() {
    let mut q = one_class();
    // tenant 1 alone for a long time: large counter
    for _ in 0..100 {
        let t = enq(&mut q, 0, 1, 1.0, 0);
        let (tk, c, tn) = q.dequeue(0).unwrap();
        assert_eq!(tk, t);
        q.settle(c, tn, 0, 100, 0).unwrap();
    }
    let c1 = q.counter(0, 1).unwrap();
    assert!(c1 >= 20_000.0);
    // tenant 1 stays backlogged; tenant 2 arrives: lifted to tenant 1's counter
    for _ in 0..4 {
        enq(&mut q, 0, 1, 1.0, 0);
    }
    enq(&mut q, 0, 2, 1.0, 0);
    assert_eq!(q.counter(0, 2).unwrap(), c1);
    // from here they alternate instead of tenant 2 taking 100 turns in a row
    let mut order = Vec::new();
    for _ in 0..8 {
        let (_, c, t) = q.dequeue(0).unwrap();
        q.settle(c, t, 0, 100, 0).unwrap();
        order.push(t);
        enq(&mut q, 0, t, 1.0, 0);
    }
    let twos = order.iter().filter(|&&t| t == 2).count();
    assert!((3..=5).contains(&twos), "order {order:?}");
}

#[test]
fn returning_tenant_banks_no_credit_while_idle() {
    let mut q = one_class();
    // both served equally, then tenant 2 leaves while tenant 1 goes on alone
    q.admit(0, 2, 1.0, 0, 0).unwrap();
    q.settle(0, 2, 0, 10, 0).unwrap();
    for _ in 0..50 {
        q.admit(0, 1, 1.0, 0, 0).unwrap();
        q.settle(0, 1, 0, 10, 0).unwrap();
    }
    enq(&mut q, 0, 1, 1.0, 0);
    enq(&mut q, 0, 1, 1.0, 0);
    enq(&mut q, 0, 2, 1.0, 0);
    // tenant 2 is lifted to tenant 1's counter, not kept 49 requests behind
    assert_eq!(q.counter(0, 2), q.counter(0, 1));
}

#[test]
fn queue_empty_lift_uses_last_tenant_that_left() {
    let mut q = one_class();
    enq(&mut q, 0, 1, 1.0, 0);
    let (_, c, t) = q.dequeue(0).unwrap();
    q.settle(c, t, 0, 500, 0).unwrap();
    // counter of tenant 1 when it left = 0 (charged after leaving): last_left is 0
    q.admit(0, 1, 1.0, 100, 0).unwrap(); // leaves again with 1000 + 100
    enq(&mut q, 0, 9, 1.0, 0);
    assert_eq!(q.counter(0, 9).unwrap(), q.counter(0, 1).unwrap());
}

#[test]
fn max_len_per_class() {
    let mut q = FairQueue::new(
        vec![class(0, 1.0, 2), class(1, 1.0, 1)],
        CostModel::default(),
    )
    .unwrap();
    enq(&mut q, 0, 1, 1.0, 0);
    enq(&mut q, 0, 2, 1.0, 0);
    assert_eq!(q.enqueue(0, 3, 1.0, 0, 0).unwrap(), None);
    enq(&mut q, 1, 3, 1.0, 0); // the other class has its own bound
    assert_eq!(q.enqueue(1, 3, 1.0, 0, 0).unwrap(), None);
    q.dequeue(0).unwrap();
    assert!(q.enqueue(0, 3, 1.0, 0, 0).unwrap().is_some());
    q.set_max_len(1, 5);
    assert!(q.enqueue(1, 3, 1.0, 0, 0).unwrap().is_some());
    assert_eq!(q.class_len(1), 2);
}

#[test]
fn cancelled_waiter_leaves_at_once_and_is_never_dequeued() {
    let mut q = one_class();
    let a = enq(&mut q, 0, 1, 1.0, 0);
    let b = enq(&mut q, 0, 2, 1.0, 0);
    let c = enq(&mut q, 0, 1, 1.0, 0);
    assert!(q.cancel(a));
    assert!(!q.cancel(a));
    assert_eq!(q.len(), 2);
    assert_eq!(q.class_len(0), 2);
    let first = q.dequeue(0).unwrap().0;
    let second = q.dequeue(0).unwrap().0;
    let mut got = [first, second];
    got.sort_unstable();
    assert_eq!(got, [b, c]);
    assert!(q.dequeue(0).is_none());
    // a tenant whose only waiter is cancelled leaves the backlog
    let d = enq(&mut q, 0, 3, 1.0, 0);
    assert!(q.cancel(d));
    assert!(q.dequeue(0).is_none());
    assert!(q.is_empty());
}

#[test]
fn same_order_classes_share_a_level_with_class_weights() {
    // interactive (weight 1) and batch (weight 4) at the same order: a tenant's batch
    // requests use its share four times faster
    let mut q = FairQueue::new(
        vec![class(0, 1.0, 100), class(0, 4.0, 100)],
        CostModel::default(),
    )
    .unwrap();
    let mut n = [0u32; 2];
    for _ in 0..4 {
        enq(&mut q, 0, 1, 1.0, 0);
        enq(&mut q, 1, 2, 1.0, 0);
    }
    for _ in 0..1000 {
        let (_, c, t) = q.dequeue(0).unwrap();
        q.settle(c, t, 0, 10, 0).unwrap();
        n[c as usize] += 1;
        enq(&mut q, c, t, 1.0, 0);
    }
    let ratio = n[0] as f64 / n[1] as f64;
    assert!((ratio - 4.0).abs() < 0.2, "interactive/batch {ratio}");
}

#[test]
fn settle_corrects_the_input_estimate_and_counts_request_cost() {
    let cost = CostModel {
        input: 1.0,
        output: 2.0,
        token: 1.0,
        request: 5.0,
    };
    let mut q = FairQueue::new(vec![class(0, 1.0, 10)], cost).unwrap();
    q.admit(0, 1, 2.0, 100, 0).unwrap(); // (100 + 5) / 2
    assert_eq!(q.counter(0, 1), Some(52.5));
    q.settle(0, 1, -40, 10, 0).unwrap(); // (-40 + 20) / 2
    assert_eq!(q.counter(0, 1), Some(42.5));
    q.settle(0, 1, -1000, 0, 0).unwrap(); // never below 0
    assert_eq!(q.counter(0, 1), Some(0.0));
}

#[test]
fn prune_forgets_idle_tenants_only() {
    let mut q = one_class();
    q.admit(0, 1, 1.0, 0, 0).unwrap(); // in flight
    q.admit(0, 2, 1.0, 0, 0).unwrap();
    q.settle(0, 2, 0, 1, 0).unwrap(); // idle since 0
    enq(&mut q, 0, 3, 1.0, 0); // waiting
    q.admit(0, 4, 1.0, 0, 0).unwrap();
    q.settle(0, 4, 0, 1, 900).unwrap(); // idle since 900
    assert_eq!(q.prune(1000, 500), vec![2]);
    assert_eq!(q.tenants(), 3);
    q.settle(0, 1, 0, 1, 1000).unwrap();
    assert_eq!(q.prune(2000, 500), vec![1, 4]);
    assert_eq!(q.tenants(), 1);
}

#[test]
fn waiting_lists_arrival_order() {
    let mut q = FairQueue::new(
        vec![class(0, 1.0, 10), class(1, 1.0, 10)],
        CostModel::default(),
    )
    .unwrap();
    let a = enq(&mut q, 1, 5, 1.0, 0);
    let b = enq(&mut q, 0, 6, 1.0, 0);
    let c = enq(&mut q, 1, 5, 1.0, 0);
    q.cancel(c);
    assert_eq!(q.waiting(), vec![(a, 1, 5), (b, 0, 6)]);
}

#[test]
fn ten_thousand_waiters_from_a_thousand_tenants_stay_consistent() {
    let mut q = one_class();
    for i in 0..10_000u32 {
        enq(&mut q, 0, i % 1000, 1.0 + (i % 3) as f64, 8);
    }
    let mut seen = 0;
    for i in 0..50_000u32 {
        let (tk, c, t) = q.dequeue(0).unwrap();
        assert!(tk > 0);
        q.settle(c, t, 0, (i % 17) as u64, 0).unwrap();
        enq(&mut q, 0, t, 1.0, 8);
        seen += 1;
    }
    assert_eq!(seen, 50_000);
    assert_eq!(q.len(), 10_000);
    assert_eq!(q.class_len(0), 10_000);
}
