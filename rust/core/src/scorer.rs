//! The scheduling decision: endpoint signals held here, a pipeline of filter and score
//! policies ([`crate::policies`], Kthena's plugin names), one call per request.
//!
//! `schedule` does, over the live endpoints:
//! 1. filters in configured order (a filter that would leave no candidate is undone);
//! 2. weighted mean of the score policies' [0, 1] scores;
//! 3. order by score, ties broken by a hash of (request-id hash, endpoint id), so that equal
//!    endpoints (e.g. a prefix miss everywhere) are spread over requests, not piled on one;
//! 4. hot-spot guard (only when an affinity policy — prefix-cache, kvcache-aware,
//!    lora-affinity — is configured): if the top endpoint's load exceeds the least loaded
//!    candidate's by more than `hot_spot_abs` AND more than `hot_spot_rel` times it, every
//!    endpoint so far above the least loaded goes to the back of the list, the others keep
//!    their score order: a request leaves a hot spot for the best of the rest (an endpoint
//!    that already holds its prefix, if one is not hot), not for the idlest;
//! 5. the ordered endpoint ids (at most `max_candidates`, 0 = all) for failover.
//!
//! Unknown is worst: an endpoint is stale until its first metrics and again after a failed
//! scrape; its load is +inf (never idle) and its load/latency/usage scores are 0.

use crate::policies::{self, mix64, Args, Ctx, Policy};
use hashbrown::HashMap;

/// The request-id hash `schedule` expects: xxh3-64 of the id's bytes.
pub fn request_hash(request_id: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(request_id)
}

/// What the router knows about one endpoint.
#[derive(Clone, Debug)]
pub struct Signals {
    pub id: u32,
    /// Hash of the endpoint's identity (its address), the same in every router process;
    /// what consistent hashing ranks (`id` is one process's interning). Default: from `id`.
    pub identity: u64,
    /// Requests this router has dispatched there and not finished.
    pub in_flight: u32,
    /// `in_flight` when the engine's counts were last scraped.
    pub in_flight_at_scrape: u32,
    /// What the pod's other router workers dispatched there (+) and saw finish (-), as
    /// relayed to this one (pod-state hub): their requests in flight there. A relay lost
    /// with a worker leaves it off by that worker's share; `load` uses only its change
    /// since the scrape, which the next scrape bounds.
    pub remote_in_flight: i64,
    /// `remote_in_flight` when the engine's counts were last scraped (which count them).
    pub remote_at_scrape: i64,
    /// Engine counts and KV-cache usage (0..1) from the last scrape; NaN = not reported.
    pub running: f64,
    pub waiting: f64,
    pub kv_usage: f64,
    /// Mean TTFT and time per output token, seconds; NaN = no sample yet.
    pub ttft_s: f64,
    pub tpot_s: f64,
    /// Prefill work in progress here as the router sees it (prefill-cost): the uncached
    /// prompt blocks of the requests dispatched here whose first token has not arrived
    /// ([`Scorer::add_pending`]).
    pub pending_blocks: f64,
    /// The share of the prefix the router's index credits this engine with that the engine
    /// reports serving from its cache (0..1, 1 = as credited or not measured): what it
    /// evicted that the index still lists ([`Scorer::set_realization`]).
    pub hit_realization: f64,
    pub stale: bool,
    /// Loaded LoRA adapter ids (the caller's interning of adapter names) and capacity.
    pub loras: Vec<u32>,
    pub max_loras: u32,
    /// (adapter id, requests this router has in flight there with it): the adapters the
    /// engine's batch holds now, which a scrape sees only once per period.
    pub lora_in_flight: Vec<(u32, u32)>,
    /// The same for the pod's other workers (relayed by the pod-state hub); adapters the
    /// engine's last scrape does not list are dropped (`retain_remote_loras`).
    pub lora_remote: Vec<(u32, u32)>,
}

impl Signals {
    pub fn new(id: u32) -> Self {
        Signals {
            id,
            identity: mix64(u64::from(id)),
            in_flight: 0,
            in_flight_at_scrape: 0,
            remote_in_flight: 0,
            remote_at_scrape: 0,
            running: f64::NAN,
            waiting: f64::NAN,
            kv_usage: f64::NAN,
            ttft_s: f64::NAN,
            tpot_s: f64::NAN,
            pending_blocks: 0.0,
            hit_realization: 1.0,
            stale: true,
            loras: Vec::new(),
            max_loras: 0,
            lora_in_flight: Vec::new(),
            lora_remote: Vec::new(),
        }
    }

    /// Requests of adapter `lora` this router (this worker and, relayed, the pod's others)
    /// has in flight here.
    pub fn lora_in_flight_of(&self, lora: u32) -> u32 {
        let of = |v: &[(u32, u32)]| v.iter().find(|(l, _)| *l == lora).map_or(0, |&(_, n)| n);
        of(&self.lora_in_flight).saturating_add(of(&self.lora_remote))
    }

    /// Distinct adapters in flight here (this worker's and the pod's other workers').
    pub fn lora_active(&self) -> usize {
        let own = &self.lora_in_flight;
        own.len() + self.lora_remote.iter().filter(|(l, _)| !own.iter().any(|(o, _)| o == l)).count()
    }

    /// Estimated requests on the engine: running + waiting at the scrape, plus what this
    /// router (and the pod's other workers, relayed) dispatched or saw finish since, never
    /// below our own in-flight. Reacts within one request without counting our requests
    /// twice once the engine sees them. +inf when stale or not reported.
    pub fn load(&self) -> f64 {
        if self.stale {
            return f64::INFINITY;
        }
        let since = f64::from(self.in_flight) - f64::from(self.in_flight_at_scrape);
        let remote = self.remote_in_flight.saturating_sub(self.remote_at_scrape);
        let est = self.running + self.waiting + since + remote as f64;
        if est.is_nan() {
            f64::INFINITY
        } else {
            est.max(f64::from(self.in_flight))
        }
    }
}

/// Plugin configuration in Kthena's terms (names, weights, args) plus the guard.
#[derive(Clone, Debug)]
pub struct ScorerConfig {
    /// `plugins.Filter.enabled`, in order.
    pub filters: Vec<String>,
    /// `plugins.Score.enabled`: (name, weight).
    pub scores: Vec<(String, f64)>,
    /// `pluginConfig`: (name, args). Entries for plugins not enabled are ignored.
    pub args: Vec<(String, Args)>,
    /// Hot-spot guard thresholds (requests, ratio); `f64::INFINITY` disables.
    pub hot_spot_abs: f64,
    pub hot_spot_rel: f64,
    pub max_candidates: usize,
}

impl Default for ScorerConfig {
    fn default() -> Self {
        ScorerConfig {
            filters: Vec::new(),
            scores: Vec::new(),
            args: Vec::new(),
            hot_spot_abs: 64.0,
            hot_spot_rel: 1.5,
            max_candidates: 0,
        }
    }
}

/// See the module docs. Endpoint ids are the caller's `u32`s.
#[derive(Debug)]
pub struct Scorer {
    eps: Vec<Signals>,
    slot_of: HashMap<u32, u32>,
    free: Vec<u32>,
    /// Live slots sorted by endpoint id: a stable order for round-robin.
    live: Vec<u32>,
    filters: Vec<Box<dyn Policy>>,
    scores: Vec<(Box<dyn Policy>, f64)>,
    weight_sum: f64,
    guard: bool,
    hot_spot_abs: f64,
    hot_spot_rel: f64,
    max_candidates: usize,
    warnings: Vec<String>,
    seq: u64,
    hot_spot_count: u64,
    // Scratch, kept between calls (no allocation per request once warm).
    load: Vec<f64>,
    prefix: Vec<f64>,
    touched: Vec<u32>,
    cands: Vec<u32>,
    prev: Vec<u32>,
    part: Vec<f64>,
    total: Vec<f64>,
    ranked: Vec<Ranked>,
}

/// (combined score, tie-break key, slot).
type Ranked = (f64, u64, u32);

const EWMA_ALPHA: f64 = 0.2;

impl Scorer {
    pub fn new(cfg: &ScorerConfig) -> Result<Scorer, String> {
        let empty = Args::default();
        let args_of = |name: &str| {
            cfg.args
                .iter()
                .find(|(n, _)| n == name)
                .map_or(&empty, |(_, a)| a)
        };
        let mut warnings = Vec::new();
        let mut filters = Vec::new();
        for name in &cfg.filters {
            if !policies::info(name)?.filter {
                return Err(format!("scheduler plugin {name:?} is not a filter"));
            }
            let (p, w) = policies::build(name, args_of(name))?;
            warnings.extend(w);
            filters.push(p);
        }
        let mut scores = Vec::new();
        let mut guard = false;
        for (name, weight) in &cfg.scores {
            if !(weight.is_finite() && *weight >= 0.0) {
                return Err(format!(
                    "scheduler plugin {name:?}: weight must be >= 0, got {weight}"
                ));
            }
            let info = policies::info(name)?;
            if !info.score {
                return Err(format!("scheduler plugin {name:?} is not a score plugin"));
            }
            let (p, w) = policies::build(name, args_of(name))?;
            if !cfg.filters.contains(name) {
                warnings.extend(w);
            }
            guard |= info.affinity && *weight > 0.0;
            scores.push((p, *weight));
        }
        if !(cfg.hot_spot_abs >= 0.0 && cfg.hot_spot_rel >= 1.0) {
            return Err("hot-spot guard: abs must be >= 0 and rel >= 1".into());
        }
        Ok(Scorer {
            eps: Vec::new(),
            slot_of: HashMap::new(),
            free: Vec::new(),
            live: Vec::new(),
            weight_sum: scores.iter().map(|(_, w)| w).sum(),
            guard,
            filters,
            scores,
            hot_spot_abs: cfg.hot_spot_abs,
            hot_spot_rel: cfg.hot_spot_rel,
            max_candidates: cfg.max_candidates,
            warnings,
            seq: 0,
            hot_spot_count: 0,
            load: Vec::new(),
            prefix: Vec::new(),
            touched: Vec::new(),
            cands: Vec::new(),
            prev: Vec::new(),
            part: Vec::new(),
            total: Vec::new(),
            ranked: Vec::new(),
        })
    }

    /// Non-fatal configuration remarks (ignored arguments).
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// Times the hot-spot guard reordered a decision.
    pub fn hot_spot_count(&self) -> u64 {
        self.hot_spot_count
    }

    /// Register an endpoint (stale until its first metrics); returns its slot.
    pub fn add_endpoint(&mut self, id: u32) -> u32 {
        if let Some(&s) = self.slot_of.get(&id) {
            return s;
        }
        let s = match self.free.pop() {
            Some(s) => {
                self.eps[s as usize] = Signals::new(id);
                s
            }
            None => {
                self.eps.push(Signals::new(id));
                self.load.push(0.0);
                self.prefix.push(0.0);
                (self.eps.len() - 1) as u32
            }
        };
        self.slot_of.insert(id, s);
        let eps = &self.eps;
        let pos = self.live.partition_point(|&x| eps[x as usize].id < id);
        self.live.insert(pos, s);
        s
    }

    /// Set the endpoint's identity hash (see [`Signals::identity`]); registers it.
    pub fn set_identity(&mut self, id: u32, identity: u64) {
        self.sig_mut(id).identity = identity;
    }

    pub fn remove_endpoint(&mut self, id: u32) -> bool {
        let Some(s) = self.slot_of.remove(&id) else {
            return false;
        };
        self.live.retain(|&x| x != s);
        self.free.push(s);
        true
    }

    /// Live endpoint ids, ascending.
    pub fn endpoints(&self) -> Vec<u32> {
        self.live.iter().map(|&s| self.eps[s as usize].id).collect()
    }

    pub fn signals(&self, id: u32) -> Option<&Signals> {
        self.slot_of.get(&id).map(|&s| &self.eps[s as usize])
    }

    fn sig_mut(&mut self, id: u32) -> &mut Signals {
        let s = self.add_endpoint(id);
        &mut self.eps[s as usize]
    }

    /// A successful scrape: engine counts and usage (NaN = not reported), interval-mean
    /// TTFT/TPOT (NaN = no sample this interval: the previous value is kept). Clears stale.
    pub fn update_metrics(
        &mut self,
        id: u32,
        running: f64,
        waiting: f64,
        kv_usage: f64,
        ttft_s: f64,
        tpot_s: f64,
    ) {
        let e = self.sig_mut(id);
        e.running = running;
        e.waiting = waiting;
        e.kv_usage = kv_usage;
        if !ttft_s.is_nan() {
            e.ttft_s = ttft_s;
        }
        if !tpot_s.is_nan() {
            e.tpot_s = tpot_s;
        }
        e.in_flight_at_scrape = e.in_flight;
        e.remote_at_scrape = e.remote_in_flight;
        e.stale = false;
    }

    /// A failed scrape: load signals are unknown (worst) until the next success.
    pub fn mark_stale(&mut self, id: u32) {
        self.sig_mut(id).stale = true;
    }

    /// Dispatch (+1) or completion (-1) of a request; returns the new in-flight count.
    /// At zero, the endpoint's pending prefill work (prefill-cost) is cleared.
    pub fn add_in_flight(&mut self, id: u32, delta: i64) -> u32 {
        let e = self.sig_mut(id);
        let v = (i64::from(e.in_flight) + delta).clamp(0, i64::from(u32::MAX));
        e.in_flight = v as u32;
        if e.in_flight == 0 {
            // nothing of ours left there: no prefill of ours is pending either
            e.pending_blocks = 0.0;
        }
        e.in_flight
    }

    /// Dispatch (+1) or completion (-1) of a request for adapter `lora` on `id`.
    pub fn add_lora_in_flight(&mut self, id: u32, lora: u32, delta: i64) {
        bump(&mut self.sig_mut(id).lora_in_flight, lora, delta);
    }

    /// The pod's other workers' dispatches (+) and completions (-) for adapter `lora` on `id`.
    pub fn add_remote_lora_in_flight(&mut self, id: u32, lora: u32, delta: i64) {
        bump(&mut self.sig_mut(id).lora_remote, lora, delta);
    }

    /// Keep the relayed adapters of `id` that the engine reports running or waiting: a
    /// completion the relay lost (a worker gone mid-request) must not hold a slot forever.
    pub fn retain_remote_loras(&mut self, id: u32, listed: &[u32]) {
        self.sig_mut(id).lora_remote.retain(|(l, _)| listed.contains(l));
    }

    /// Forget every relayed adapter count (the hub connection changed: no history).
    pub fn clear_remote_loras(&mut self) {
        for e in self.eps.iter_mut() {
            e.lora_remote.clear();
        }
    }

    /// Dispatches (+) and completions (-) of the pod's other workers on `id`, relayed;
    /// `load` counts the change since the last scrape.
    pub fn add_remote_in_flight(&mut self, id: u32, delta: i64) {
        let e = self.sig_mut(id);
        e.remote_in_flight = e.remote_in_flight.saturating_add(delta);
    }

    /// The router's own TTFT / TPOT observation (NaN = none), blended into the scraped
    /// means (EWMA, alpha 0.2) so latency reacts between scrapes.
    pub fn observe_latency(&mut self, id: u32, ttft_s: f64, tpot_s: f64) {
        let e = self.sig_mut(id);
        for (cur, obs) in [(&mut e.ttft_s, ttft_s), (&mut e.tpot_s, tpot_s)] {
            if obs.is_nan() {
                continue;
            }
            *cur = if cur.is_nan() {
                obs
            } else {
                *cur + EWMA_ALPHA * (obs - *cur)
            };
        }
    }

    /// Prefill work dispatched to the endpoint (+ its uncached blocks) or done there (-
    /// the same blocks, at the request's first token or its end); floored at 0, NaN ignored.
    pub fn add_pending(&mut self, id: u32, blocks: f64) {
        if blocks.is_finite() {
            let e = self.sig_mut(id);
            e.pending_blocks = (e.pending_blocks + blocks).max(0.0);
        }
    }

    /// The engine's measured share of its credited prefix hits (0..1); NaN = not measured (1).
    pub fn set_realization(&mut self, id: u32, r: f64) {
        self.sig_mut(id).hit_realization = if r.is_nan() { 1.0 } else { r.clamp(0.0, 1.0) };
    }

    pub fn set_loras(&mut self, id: u32, loras: &[u32], max_loras: u32) {
        let e = self.sig_mut(id);
        e.loras.clear();
        e.loras.extend_from_slice(loras);
        e.max_loras = max_loras;
    }

    /// One scheduling decision (see the module docs). `prefix_matches`: (endpoint id,
    /// matched leading blocks) out of `total_blocks`; unknown ids are ignored.
    pub fn schedule(
        &mut self,
        request_hash: u64,
        prefix_matches: &[(u32, u32)],
        lora: Option<u32>,
        total_blocks: u32,
        out: &mut Vec<u32>,
    ) {
        self.schedule_keyed(request_hash, None, prefix_matches, lora, total_blocks, out);
    }

    /// [`Self::schedule`] with the request's prefix key for consistent-hash policies
    /// (`None`: the request hash stands in).
    pub fn schedule_keyed(
        &mut self,
        request_hash: u64,
        prefix_key: Option<u64>,
        prefix_matches: &[(u32, u32)],
        lora: Option<u32>,
        total_blocks: u32,
        out: &mut Vec<u32>,
    ) {
        out.clear();
        let seq = self.seq;
        self.seq = self.seq.wrapping_add(1);
        self.cands.clear();
        self.cands.extend_from_slice(&self.live);
        for &s in &self.cands {
            self.load[s as usize] = self.eps[s as usize].load();
        }
        self.touched.clear();
        if total_blocks > 0 {
            for &(id, n) in prefix_matches {
                if let Some(&s) = self.slot_of.get(&id) {
                    self.prefix[s as usize] =
                        f64::from(n.min(total_blocks)) / f64::from(total_blocks);
                    self.touched.push(s);
                }
            }
        }
        let ctx = Ctx {
            eps: &self.eps,
            load: &self.load,
            prefix: &self.prefix,
            total_blocks: f64::from(total_blocks),
            request_hash,
            prefix_key: prefix_key.unwrap_or(request_hash),
            lora,
            seq,
        };
        for f in &self.filters {
            self.prev.clear();
            self.prev.extend_from_slice(&self.cands);
            f.filter(&ctx, &mut self.cands);
            if self.cands.is_empty() {
                std::mem::swap(&mut self.cands, &mut self.prev);
            }
        }
        let n = self.cands.len();
        self.total.clear();
        self.total.resize(n, 0.0);
        for (p, w) in &self.scores {
            if *w == 0.0 {
                continue;
            }
            self.part.clear();
            self.part.resize(n, 0.0);
            p.score(&ctx, &self.cands, &mut self.part);
            for (t, &v) in self.total.iter_mut().zip(&self.part) {
                // A policy bug must not poison the order: NaN counts as 0.
                *t += w * if v.is_nan() { 0.0 } else { v.clamp(0.0, 1.0) };
            }
        }
        let wsum = if self.weight_sum > 0.0 {
            self.weight_sum
        } else {
            1.0
        };
        self.ranked.clear();
        self.ranked
            .extend(self.cands.iter().zip(&self.total).map(|(&s, &t)| {
                (
                    t / wsum,
                    mix64(request_hash ^ mix64(u64::from(self.eps[s as usize].id))),
                    s,
                )
            }));
        for &s in &self.touched {
            self.prefix[s as usize] = 0.0;
        }

        let by_score = |a: &Ranked, b: &Ranked| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
        let load = &self.load;
        let guarded = self.guard && n > 1;
        let min = if guarded {
            self.cands
                .iter()
                .map(|&s| load[s as usize])
                .fold(f64::INFINITY, f64::min)
        } else {
            f64::INFINITY // nothing is hot
        };
        let (abs, rel) = (self.hot_spot_abs, self.hot_spot_rel);
        // inf - inf is NaN and fails the test: all-stale sets are left to the scores.
        let hot = |s: u32| {
            let l = load[s as usize];
            min.is_finite() && l - min > abs && l > rel * min
        };
        // Hot spots go last; the others keep their score order, so a request moved off a
        // hot spot goes where its prefix or adapter is already replicated, if anywhere,
        // rather than to the least loaded endpoint whatever it holds.
        let by_guard = |a: &Ranked, b: &Ranked| hot(a.2).cmp(&hot(b.2)).then(by_score(a, b));
        let load_wins = guarded
            && self
                .ranked
                .iter()
                .min_by(|a, b| by_score(a, b))
                .is_some_and(|t| hot(t.2));
        let k = if self.max_candidates == 0 {
            n
        } else {
            self.max_candidates.min(n)
        };
        let cmp: &dyn Fn(&Ranked, &Ranked) -> std::cmp::Ordering =
            if load_wins { &by_guard } else { &by_score };
        if k < n && k > 0 {
            self.ranked.select_nth_unstable_by(k - 1, cmp);
            self.ranked.truncate(k);
        }
        self.ranked.sort_unstable_by(cmp);
        if load_wins {
            self.hot_spot_count += 1;
        }
        out.extend(
            self.ranked
                .iter()
                .take(k)
                .map(|&(_, _, s)| self.eps[s as usize].id),
        );
    }
}


/// Adds `delta` to adapter `lora`'s count in `v`, floored at 0; a count of 0 is removed.
fn bump(v: &mut Vec<(u32, u32)>, lora: u32, delta: i64) {
    let i = match v.iter().position(|(l, _)| *l == lora) {
        Some(i) => i,
        None if delta > 0 => {
            v.push((lora, 0));
            v.len() - 1
        }
        None => return,
    };
    let n = (i64::from(v[i].1) + delta).clamp(0, i64::from(u32::MAX)) as u32;
    if n == 0 {
        v.swap_remove(i);
    } else {
        v[i].1 = n;
    }
}

#[cfg(test)]
#[path = "scorer_tests.rs"]
mod tests;
