//! The fair queue of one model: who goes next when the model's endpoints are saturated.
//!
//! Order: priority level first (the classes' `order`, ascending; classes of equal order
//! share a level), then, within a level, a virtual token counter per tenant (VTC, Sheng et
//! al., "Fairness in Serving Large Language Models", OSDI 2024):
//! * the next request is the oldest one of the backlogged tenant with the smallest counter;
//! * a tenant is charged for what it is served: `token * (input * in + output * out) +
//!   request` per request, times its class weight, divided by its tenant weight; the input
//!   estimate and the per-request cost at dispatch, the rest when the request ends;
//! * a tenant that becomes backlogged is lifted to the smallest counter of the backlogged
//!   tenants (or, with none, to the counter of the last tenant that left the queue): idle
//!   time banks no credit, and a newcomer cannot starve the others.
//!
//! Tickets identify waiters; a cancelled waiter (client gone, max wait) leaves at once:
//! its tenant leaves the backlog when it has no waiter left, and stale tickets in the
//! tenant's FIFO are skipped later. Everything is integers and floats: the binding crosses
//! the Python boundary with tenant ids interned on the Python side.

use std::collections::{BTreeSet, VecDeque};

use hashbrown::HashMap;

/// One priority class.
#[derive(Clone, Debug, PartialEq)]
pub struct ClassSpec {
    /// Levels are served in ascending order; classes of equal order share a level.
    pub order: u32,
    /// Multiplies the cost charged for this class's requests (meaningful within a level).
    pub weight: f64,
    /// Waiters of this class at most; `enqueue` refuses beyond it.
    pub max_len: u32,
}

/// What one request costs its tenant (Kthena's FAIRNESS_*_WEIGHT settings).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CostModel {
    pub input: f64,
    pub output: f64,
    pub token: f64,
    pub request: f64,
}

impl Default for CostModel {
    fn default() -> Self {
        CostModel {
            input: 1.0,
            output: 2.0,
            token: 1.0,
            request: 0.0,
        }
    }
}

impl CostModel {
    fn tokens(&self, input: f64, output: f64) -> f64 {
        self.token * (self.input * input + self.output * output)
    }
}

struct Tenant {
    counter: f64,
    weight: f64,
    fifo: VecDeque<u64>,
    /// Live waiters (cancelled ones excluded); > 0 exactly when in the backlog.
    live: u32,
    /// Dispatched and not settled yet.
    in_flight: u32,
    last_active_ms: u64,
}

#[derive(Default)]
struct Level {
    tenants: HashMap<u32, Tenant>,
    /// (counter bits, tenant) of the tenants with live waiters; counters are >= 0, so
    /// their IEEE bits order as the values do.
    backlog: BTreeSet<(u64, u32)>,
    last_left: f64,
    len: u32,
}

struct Waiter {
    class: u32,
    tenant: u32,
    input_est: u32,
}

pub struct FairQueue {
    classes: Vec<ClassSpec>,
    class_level: Vec<usize>,
    class_len: Vec<u32>,
    levels: Vec<Level>,
    waiters: HashMap<u64, Waiter>,
    cost: CostModel,
    next_ticket: u64,
}

fn finite_nonneg(x: f64) -> bool {
    x.is_finite() && x >= 0.0
}

fn clamp(c: f64) -> f64 {
    if c > 0.0 && c.is_finite() {
        c
    } else if c.is_infinite() && c > 0.0 {
        f64::MAX
    } else {
        0.0
    }
}

impl Level {
    fn tenant(
        tenants: &mut HashMap<u32, Tenant>,
        id: u32,
        weight: f64,
        now_ms: u64,
    ) -> &mut Tenant {
        let t = tenants.entry(id).or_insert_with(|| Tenant {
            counter: 0.0,
            weight,
            fifo: VecDeque::new(),
            live: 0,
            in_flight: 0,
            last_active_ms: now_ms,
        });
        t.weight = weight;
        t.last_active_ms = now_ms;
        t
    }

    /// What a tenant that becomes backlogged is lifted to (VTC): the smallest backlogged
    /// counter, or with none, the counter of the last tenant that left the queue.
    fn floor(&self) -> f64 {
        match self.backlog.first() {
            Some(&(bits, _)) => f64::from_bits(bits),
            None => self.last_left,
        }
    }

    /// Add `amount` (may be negative: an estimate settled lower) to a tenant's counter,
    /// keeping the backlog ordered.
    fn charge(&mut self, id: u32, amount: f64) {
        let Some(t) = self.tenants.get_mut(&id) else {
            return;
        };
        let old = t.counter;
        let new = clamp(old + amount);
        if new == old {
            return;
        }
        t.counter = new;
        if t.live > 0 {
            self.backlog.remove(&(old.to_bits(), id));
            self.backlog.insert((new.to_bits(), id));
        }
    }
}

impl FairQueue {
    pub fn new(classes: Vec<ClassSpec>, cost: CostModel) -> Result<Self, String> {
        if classes.is_empty() {
            return Err("at least one priority class is needed".into());
        }
        for (i, c) in classes.iter().enumerate() {
            if !(c.weight.is_finite() && c.weight > 0.0) {
                return Err(format!(
                    "class {i}: weight must be a number > 0, got {}",
                    c.weight
                ));
            }
        }
        for (name, v) in [
            ("input", cost.input),
            ("output", cost.output),
            ("token", cost.token),
            ("request", cost.request),
        ] {
            if !finite_nonneg(v) {
                return Err(format!("{name} cost weight must be a number >= 0, got {v}"));
            }
        }
        let mut orders: Vec<u32> = classes.iter().map(|c| c.order).collect();
        orders.sort_unstable();
        orders.dedup();
        let class_level = classes
            .iter()
            .map(|c| orders.binary_search(&c.order).unwrap_or(0))
            .collect();
        let levels = orders.iter().map(|_| Level::default()).collect();
        Ok(FairQueue {
            class_len: vec![0; classes.len()],
            classes,
            class_level,
            levels,
            waiters: HashMap::new(),
            cost,
            next_ticket: 1,
        })
    }

    pub fn classes(&self) -> &[ClassSpec] {
        &self.classes
    }

    pub fn cost(&self) -> CostModel {
        self.cost
    }

    /// Waiters in all classes.
    pub fn len(&self) -> usize {
        self.waiters.len()
    }

    pub fn is_empty(&self) -> bool {
        self.waiters.is_empty()
    }

    pub fn class_len(&self, class: u32) -> u32 {
        self.class_len.get(class as usize).copied().unwrap_or(0)
    }

    /// Change a class's bound; waiters already above it stay.
    pub fn set_max_len(&mut self, class: u32, max_len: u32) {
        if let Some(c) = self.classes.get_mut(class as usize) {
            c.max_len = max_len;
        }
    }

    fn class_ok(&self, class: u32) -> Result<usize, String> {
        let i = class as usize;
        if i < self.classes.len() {
            Ok(i)
        } else {
            Err(format!(
                "no priority class {class} (there are {})",
                self.classes.len()
            ))
        }
    }

    fn tenant_weight(weight: f64) -> Result<f64, String> {
        if weight.is_finite() && weight > 0.0 {
            Ok(weight)
        } else {
            Err(format!("tenant weight must be a number > 0, got {weight}"))
        }
    }

    /// Queue a request: its ticket, or None when the class is at its max length.
    pub fn enqueue(
        &mut self,
        class: u32,
        tenant: u32,
        weight: f64,
        input_est: u32,
        now_ms: u64,
    ) -> Result<Option<u64>, String> {
        let ci = self.class_ok(class)?;
        let weight = Self::tenant_weight(weight)?;
        if self.class_len[ci] >= self.classes[ci].max_len {
            return Ok(None);
        }
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        let level = &mut self.levels[self.class_level[ci]];
        let floor = level.floor();
        let t = Level::tenant(&mut level.tenants, tenant, weight, now_ms);
        let newly = t.live == 0;
        if newly && t.counter < floor {
            t.counter = floor; // the VTC lift
        }
        t.live += 1;
        t.fifo.push_back(ticket);
        if newly {
            level.backlog.insert((t.counter.to_bits(), tenant));
        }
        level.len += 1;
        self.class_len[ci] += 1;
        self.waiters.insert(
            ticket,
            Waiter {
                class,
                tenant,
                input_est,
            },
        );
        Ok(Some(ticket))
    }

    /// The next waiter to dispatch (highest level, smallest counter, oldest of its
    /// tenant), charged its dispatch cost: (ticket, class, tenant).
    pub fn dequeue(&mut self, now_ms: u64) -> Option<(u64, u32, u32)> {
        let li = self.levels.iter().position(|l| l.len > 0)?;
        let level = &mut self.levels[li];
        let (_, tid) = level.backlog.pop_first()?;
        let t = level.tenants.get_mut(&tid)?;
        let (ticket, w) = loop {
            let tk = t.fifo.pop_front()?;
            if let Some(w) = self.waiters.remove(&tk) {
                break (tk, w);
            }
        };
        t.live -= 1;
        t.in_flight += 1;
        t.last_active_ms = now_ms;
        let cw = self.classes[w.class as usize].weight;
        let amount =
            (self.cost.tokens(w.input_est as f64, 0.0) + self.cost.request) * cw / t.weight;
        t.counter = clamp(t.counter + amount);
        if t.live > 0 {
            level.backlog.insert((t.counter.to_bits(), tid));
        } else {
            t.fifo.clear();
            level.last_left = t.counter;
        }
        level.len -= 1;
        self.class_len[w.class as usize] -= 1;
        Some((ticket, w.class, w.tenant))
    }

    fn dispatch_cost(&self, class: u32, tenant: u32, input_est: u32, li: usize) -> f64 {
        let tw = self.levels[li]
            .tenants
            .get(&tenant)
            .map_or(1.0, |t| t.weight);
        let cw = self.classes[class as usize].weight;
        (self.cost.tokens(input_est as f64, 0.0) + self.cost.request) * cw / tw
    }

    /// A request that goes through without waiting (nothing queued in its level and the
    /// model not saturated): lifted as a newcomer, charged its dispatch cost.
    pub fn admit(
        &mut self,
        class: u32,
        tenant: u32,
        weight: f64,
        input_est: u32,
        now_ms: u64,
    ) -> Result<(), String> {
        let ci = self.class_ok(class)?;
        let weight = Self::tenant_weight(weight)?;
        let li = self.class_level[ci];
        let level = &mut self.levels[li];
        let floor = level.floor();
        let t = Level::tenant(&mut level.tenants, tenant, weight, now_ms);
        t.in_flight += 1;
        let backlogged = t.live > 0;
        if !backlogged && t.counter < floor {
            t.counter = floor;
        }
        let amount = self.dispatch_cost(class, tenant, input_est, li);
        let level = &mut self.levels[li];
        level.charge(tenant, amount);
        if !backlogged {
            level.last_left = level.tenants[&tenant].counter;
        }
        Ok(())
    }

    /// Remove a waiter (client gone, max wait reached). False if it is not waiting.
    pub fn cancel(&mut self, ticket: u64) -> bool {
        let Some(w) = self.waiters.remove(&ticket) else {
            return false;
        };
        let ci = w.class as usize;
        self.class_len[ci] -= 1;
        let level = &mut self.levels[self.class_level[ci]];
        level.len -= 1;
        if let Some(t) = level.tenants.get_mut(&w.tenant) {
            t.live -= 1;
            if t.live == 0 {
                t.fifo.clear();
                level.backlog.remove(&(t.counter.to_bits(), w.tenant));
            }
        }
        true
    }

    /// A dispatched request ended: charge what the estimate missed (`input_delta` = real
    /// prompt tokens - the estimate) and the output tokens.
    pub fn settle(
        &mut self,
        class: u32,
        tenant: u32,
        input_delta: i64,
        output: u64,
        now_ms: u64,
    ) -> Result<(), String> {
        let ci = self.class_ok(class)?;
        let cw = self.classes[ci].weight;
        let li = self.class_level[ci];
        let level = &mut self.levels[li];
        let Some(t) = level.tenants.get_mut(&tenant) else {
            return Ok(());
        };
        t.in_flight = t.in_flight.saturating_sub(1);
        t.last_active_ms = now_ms;
        let amount = self.cost.tokens(input_delta as f64, output as f64) * cw / t.weight;
        level.charge(tenant, amount);
        Ok(())
    }

    /// A tenant's counter in a class's level (None if unknown there).
    pub fn counter(&self, class: u32, tenant: u32) -> Option<f64> {
        let li = *self.class_level.get(class as usize)?;
        self.levels[li].tenants.get(&tenant).map(|t| t.counter)
    }

    /// Forget tenants with nothing waiting or in flight, idle for `idle_ms` (they come
    /// back as newcomers). Returns the ids no level knows any more.
    pub fn prune(&mut self, now_ms: u64, idle_ms: u64) -> Vec<u32> {
        let mut gone = Vec::new();
        for level in &mut self.levels {
            level.tenants.retain(|&id, t| {
                let keep = t.live > 0
                    || t.in_flight > 0
                    || now_ms.saturating_sub(t.last_active_ms) < idle_ms;
                if !keep {
                    gone.push(id);
                }
                keep
            });
        }
        gone.sort_unstable();
        gone.dedup();
        gone.retain(|id| self.levels.iter().all(|l| !l.tenants.contains_key(id)));
        gone
    }

    /// Tenants known (any level), for tests and views.
    pub fn tenants(&self) -> usize {
        let mut ids: Vec<u32> = self
            .levels
            .iter()
            .flat_map(|l| l.tenants.keys().copied())
            .collect();
        ids.sort_unstable();
        ids.dedup();
        ids.len()
    }

    /// The waiters as (ticket, class, tenant), in arrival order (moving them to a queue
    /// built from a new configuration).
    pub fn waiting(&self) -> Vec<(u64, u32, u32)> {
        let mut out: Vec<_> = self
            .waiters
            .iter()
            .map(|(&tk, w)| (tk, w.class, w.tenant))
            .collect();
        out.sort_unstable();
        out
    }
}

#[cfg(test)]
#[path = "fairq_tests.rs"]
mod tests;
