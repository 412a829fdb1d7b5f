//! Evicted-owner hints for the approximate prefix index ([`crate::prefix_index`]).
//!
//! When the index drops a (block, endpoint) entry to stay within the endpoint's capacity,
//! the engine may still hold the block: the router's budget is a guess, the engine's
//! cache is often larger. A hint remembers the block's last owner, so a request whose
//! chain runs past what the index still holds (or misses it entirely) can score that
//! endpoint with a discounted match instead of none, and the group stays where it was
//! served (one re-prefill there at worst) instead of scattering.
//!
//! Layout: a direct-mapped table of `slots` (a power of two) 16-byte entries indexed by
//! the block hash's low bits (the chain hash is already uniform); a newer eviction
//! overwrites an older one in the same slot. Memory is `16 * slots` bytes plus one
//! counter per endpoint, whatever the traffic.
//!
//! Decay: each endpoint counts its own evictions; a hint is stamped with that count. Its
//! weight is [`HINT_WEIGHT`] halved for every [`HALF_LIFE_CAPACITIES`] x `capacity`
//! further evictions of the same endpoint (its index capacity at match time): a hint fades
//! as the endpoint turns over index-fulls of newer prefixes, a scale the configuration
//! already sets, so no time constant or traffic-sized number is needed. Hints are never confirmations: an
//! engine-reported eviction ([`EvictedHints::forget`]) and a removed endpoint void them.

use hashbrown::HashMap;

/// Weight of a fresh hint relative to a block the index holds: "maybe held" counts half.
pub const HINT_WEIGHT: f64 = 0.5;
/// A hint's half-life in index capacities of its endpoint's later evictions. The engine
/// usually caches more than the router's index budget, so a block the index dropped
/// survives on the engine for a while (an index at 1/4 of the engine: ~3 capacities).
pub const HALF_LIFE_CAPACITIES: f64 = 4.0;

const NO_EP: u32 = u32::MAX;

#[derive(Clone, Copy, Debug)]
struct Hint {
    hash: u64,
    ep: u32,
    /// The endpoint's eviction count when this hint was written.
    stamp: u32,
}

const EMPTY: Hint = Hint {
    hash: 0,
    ep: NO_EP,
    stamp: 0,
};

/// See the module docs.
#[derive(Debug)]
pub struct EvictedHints {
    slots: Vec<Hint>,
    mask: u64,
    /// Endpoint id -> evictions so far (wrapping). Absent: removed or never evicted.
    clock: HashMap<u32, u32>,
}

impl EvictedHints {
    /// A table of `slots` entries, rounded up to a power of two (at least 1).
    pub fn new(slots: u32) -> Self {
        let n = slots.max(1).next_power_of_two() as usize;
        EvictedHints {
            slots: vec![EMPTY; n],
            mask: (n - 1) as u64,
            clock: HashMap::new(),
        }
    }

    pub fn slots(&self) -> usize {
        self.slots.len()
    }

    #[inline]
    fn at(&self, hash: u64) -> usize {
        (hash & self.mask) as usize
    }

    /// `endpoint` dropped `hash` from the index (capacity, not the engine's word).
    pub fn record(&mut self, endpoint: u32, hash: u64) {
        let c = self.clock.entry(endpoint).or_insert(0);
        *c = c.wrapping_add(1);
        let stamp = *c;
        let i = self.at(hash);
        self.slots[i] = Hint {
            hash,
            ep: endpoint,
            stamp,
        };
    }

    /// The engine said `endpoint` no longer holds `hash`: drop a hint saying it does.
    pub fn forget(&mut self, endpoint: u32, hash: u64) {
        let i = self.at(hash);
        let h = self.slots[i];
        if h.ep == endpoint && h.hash == hash {
            self.slots[i] = EMPTY;
        }
    }

    /// `endpoint` is gone: its hints are void (no clock). The router never reuses an
    /// endpoint id; a reused id could revive its old hints until they are overwritten.
    pub fn remove_endpoint(&mut self, endpoint: u32) {
        self.clock.remove(&endpoint);
    }

    /// The endpoint the hint for `hash` names and the hint's weight, given the endpoint's
    /// index capacity (`cap_of`; 0 = the hint weighs nothing).
    #[inline]
    pub fn lookup(&self, hash: u64, cap_of: impl Fn(u32) -> u32) -> Option<(u32, f64)> {
        let h = self.slots[self.at(hash)];
        if h.ep == NO_EP || h.hash != hash {
            return None;
        }
        let now = *self.clock.get(&h.ep)?;
        let age = now.wrapping_sub(h.stamp);
        let cap = cap_of(h.ep);
        if cap == 0 {
            return None;
        }
        let halvings = f64::from(age) / (HALF_LIFE_CAPACITIES * f64::from(cap));
        let w = HINT_WEIGHT * (-halvings * std::f64::consts::LN_2).exp();
        (w > 0.0).then_some((h.ep, w))
    }

    /// Does the hint for `hash` name `endpoint`? Its weight if so.
    #[inline]
    pub fn weight(&self, endpoint: u32, hash: u64, cap_of: impl Fn(u32) -> u32) -> Option<f64> {
        self.lookup(hash, cap_of)
            .and_then(|(e, w)| (e == endpoint).then_some(w))
    }

    /// Bytes allocated.
    pub fn memory_bytes(&self) -> usize {
        self.slots.capacity() * std::mem::size_of::<Hint>() + self.clock.allocation_size()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_lookup_decay_and_overwrite() {
        let mut h = EvictedHints::new(5);
        assert_eq!(h.slots(), 8);
        assert_eq!(std::mem::size_of::<Hint>(), 16);
        assert!(h.lookup(42, |_| 10).is_none());
        h.record(1, 42);
        let (e, w) = h.lookup(42, |_| 10).unwrap();
        assert_eq!(e, 1);
        assert!((w - HINT_WEIGHT).abs() < 1e-12);
        // 20 more evictions of endpoint 1 (capacity 5, half-life 4 capacities): half the
        // weight.
        for k in 0..20 {
            h.record(1, 1000 + k * 8 + 1); // other slots than 42's (42 % 8 = 2)
        }
        assert_eq!(HALF_LIFE_CAPACITIES, 4.0);
        let w = h.weight(1, 42, |_| 5).unwrap();
        assert!((w - HINT_WEIGHT / 2.0).abs() < 1e-9, "{w}");
        // Another endpoint's evictions do not age it.
        for k in 0..10 {
            h.record(2, 2000 + k * 8 + 1);
        }
        assert!((h.weight(1, 42, |_| 5).unwrap() - HINT_WEIGHT / 2.0).abs() < 1e-9);
        assert!(h.weight(2, 42, |_| 10).is_none());
        // No capacity: no hint.
        assert!(h.lookup(42, |_| 0).is_none());
        // Same slot, other hash: newest wins.
        h.record(3, 42 + 8);
        assert!(h.lookup(42, |_| 10).is_none());
        assert_eq!(h.lookup(50, |_| 10).unwrap().0, 3);
    }

    #[test]
    fn forget_and_remove_endpoint() {
        let mut h = EvictedHints::new(64);
        h.record(1, 7);
        h.record(2, 9);
        h.forget(2, 7); // not its hint
        assert!(h.lookup(7, |_| 4).is_some());
        h.forget(1, 7);
        assert!(h.lookup(7, |_| 4).is_none());
        h.remove_endpoint(2);
        assert!(h.lookup(9, |_| 4).is_none());
        h.record(2, 11);
        assert!(h.lookup(11, |_| 4).is_some());
        assert!(h.memory_bytes() >= 64 * 16);
    }
}
