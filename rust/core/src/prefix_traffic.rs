//! Recent dispatch traffic per (prefix key, endpoint): where a new prefix should go
//! (prefix-cache's `balanceMisses`).
//!
//! A prefix placed on an endpoint brings its future requests there, so a miss should go
//! where the prefixes already placed are expected to bring the least load. Each prefix
//! key's rate is estimated from decayed dispatch counters, shrunk toward the pooled rate
//! of all keys (Gamma-Poisson: a prior worth [`PRIOR_REQUESTS`] requests, exposure counted
//! from the key's first dispatch). A key seen a few times counts as an average prefix, so
//! a cold start splits new prefixes by count; a key whose traffic is measured counts for
//! that traffic, so an endpoint holding a hot prefix gets fewer new ones. A key's load is
//! split between its endpoints by their shares of its recent dispatches (a replicated hot
//! prefix weighs on each replica for its share).
//!
//! The key is the chain hash of the prompt's first `key_blocks` blocks (its last block
//! when shorter): far enough to tell system prompts apart, early enough that the
//! requests of one prefix group share it. Decay is per recorded dispatch (not per
//! second), so the window follows the traffic's own pace.

use hashbrown::HashMap;

/// The prefix key covers the prompt's first this many bytes (in whole blocks): past a chat
/// template's opening, within any system prompt long enough to be worth caching.
pub const KEY_BYTES: usize = 512;
/// Dispatches over which a count decays by 1/e.
pub const WINDOW: f64 = 512.0;
/// Weight of the pooled rate in a key's estimate, in requests: a key's own rate takes
/// over once it has been seen about this many times.
pub const PRIOR_REQUESTS: f64 = 8.0;
/// A key whose decayed count falls below this is forgotten (at a renormalisation).
const FORGET: f64 = 0.02;
/// Dispatches between renormalisations (the running scale grows by e^(this / WINDOW)).
const RENORMALISE_EVERY: u32 = 4096;

#[derive(Debug, Clone)]
struct KeyTraffic {
    /// The running scale when the key was first seen (its exposure starts there).
    first: f64,
    /// (endpoint, count x the running scale at each dispatch), summed.
    eps: Vec<(u32, f64)>,
}

/// Decayed dispatch counters per (prefix key, endpoint). See the module docs.
#[derive(Debug, Clone)]
pub struct PrefixTraffic {
    key_blocks: usize,
    /// Per-dispatch decay factor: 1 - 1/WINDOW.
    decay: f64,
    /// The weight of a dispatch recorded now; older counts keep the scale of their time,
    /// so one multiplication decays them all (renormalised every RENORMALISE_EVERY).
    scale: f64,
    keys: HashMap<u64, KeyTraffic>,
    since_renormalise: u32,
    /// Scratch of `expected_load`: (key count on the endpoints asked, exposure, index of
    /// the key's first entry in `shares`).
    scratch: Vec<(f64, f64, usize)>,
    shares: Vec<(usize, f64)>,
}

impl PrefixTraffic {
    /// `key_blocks` (>= 1): the blocks that make a prompt's prefix key.
    pub fn new(key_blocks: usize) -> Self {
        PrefixTraffic {
            key_blocks: key_blocks.max(1),
            decay: 1.0 - 1.0 / WINDOW,
            scale: 1.0,
            keys: HashMap::new(),
            since_renormalise: 0,
            scratch: Vec::new(),
            shares: Vec::new(),
        }
    }

    /// Number of keys remembered.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// A request with the chain `hashes` was dispatched to `endpoint`.
    pub fn record(&mut self, endpoint: u32, hashes: &[u64]) {
        let Some(&key) = hashes.get(self.key_blocks.min(hashes.len()).wrapping_sub(1)) else {
            return;
        };
        self.scale /= self.decay;
        let w = self.scale;
        let k = self.keys.entry(key).or_insert_with(|| KeyTraffic { first: w, eps: Vec::new() });
        match k.eps.iter_mut().find(|e| e.0 == endpoint) {
            Some(e) => e.1 += w,
            None => k.eps.push((endpoint, w)),
        }
        self.since_renormalise += 1;
        if self.since_renormalise >= RENORMALISE_EVERY {
            self.renormalise();
        }
    }

    fn renormalise(&mut self) {
        let s = self.scale;
        self.keys.retain(|_, k| {
            k.first /= s;
            let mut total = 0.0;
            for e in &mut k.eps {
                e.1 /= s;
                total += e.1;
            }
            total >= FORGET
        });
        self.scale = 1.0;
        self.since_renormalise = 0;
    }

    /// Forget an endpoint that disappeared.
    pub fn remove_endpoint(&mut self, endpoint: u32) {
        self.keys.retain(|_, k| {
            k.eps.retain(|e| e.0 != endpoint);
            !k.eps.is_empty()
        });
    }

    /// The expected load (dispatches per dispatch, summed over the keys) that the prefixes
    /// already placed bring to each of `ids`, in `ids` order. Only keys dispatched to one of
    /// `ids` count, and the pooled rate is theirs (other servers' traffic is not this one's).
    pub fn expected_load(&mut self, ids: &[u32], out: &mut Vec<f64>) {
        out.clear();
        out.resize(ids.len(), 0.0);
        let PrefixTraffic { decay, scale, keys, scratch, shares, .. } = self;
        scratch.clear();
        shares.clear();
        let (mut sum_c, mut sum_e) = (0.0, 0.0);
        for k in keys.values() {
            let start = shares.len();
            let mut c = 0.0;
            for &(ep, v) in &k.eps {
                if let Some(i) = ids.iter().position(|&id| id == ep) {
                    let v = v / *scale;
                    shares.push((i, v));
                    c += v;
                }
            }
            if shares.len() == start {
                continue;
            }
            // sum of decay^age over the dispatches since the key's first, the first included
            let exposure = (1.0 - k.first / *scale) / (1.0 - *decay) + 1.0;
            scratch.push((c, exposure, start));
            sum_c += c;
            sum_e += exposure;
        }
        if scratch.is_empty() || sum_c <= 0.0 {
            return;
        }
        let prior_exposure = PRIOR_REQUESTS * sum_e / sum_c; // PRIOR_REQUESTS / pooled rate
        for (j, &(c, exposure, start)) in scratch.iter().enumerate() {
            let end = scratch.get(j + 1).map_or(shares.len(), |s| s.2);
            let rate = (c + PRIOR_REQUESTS) / (exposure + prior_exposure);
            for &(i, v) in &shares[start..end] {
                out[i] += rate * v / c;
            }
        }
    }

    /// balanceMisses' prefix score for a miss: each of `ids` by its expected load relative
    /// to the most loaded, (max - load) / max as blocks of `total` (least-request's scale:
    /// a few percent apart weighs a few percent, so a measured load gap decides and a
    /// near-tie leaves the choice to the load plugins), listing the endpoints below the
    /// most loaded; nothing without traffic on `ids`.
    pub fn miss_scores(&mut self, ids: &[u32], total: u32) -> Vec<(u32, u32)> {
        let mut load = Vec::new();
        self.expected_load(ids, &mut load);
        let hi = load.iter().copied().fold(0.0, f64::max);
        if hi.is_nan() || hi <= 0.0 {
            return Vec::new();
        }
        ids.iter()
            .zip(&load)
            .filter(|(_, &l)| l < hi)
            .map(|(&id, &l)| (id, (f64::from(total) * (hi - l) / hi).round_ties_even() as u32))
            .collect()
    }
}

#[cfg(test)]
#[path = "prefix_traffic_tests.rs"]
mod tests;
