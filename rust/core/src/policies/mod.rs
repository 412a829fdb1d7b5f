//! Scheduling policies under Kthena's plugin names, one file each, behind [`Policy`], and
//! the registry that builds them by name ([`build`]).
//!
//! A policy may filter candidates and/or score them. Scores are in [0, 1], higher is
//! better; the scorer clamps them and combines them by weight. Conventions shared by all:
//! * "unknown is worst": a stale endpoint, or a signal never received (NaN), scores as the
//!   worst possible for load and latency (0), never as idle;
//! * costs are normalised as `(max - x) / max` over the candidates' known values, so equal
//!   costs score equally, an idle endpoint scores 1, and small relative differences between
//!   busy endpoints stay small (min-max scaling would blow 100 vs 101 up to 1 vs 0);
//! * known values map into [`KNOWN_FLOOR`], 1] ([`known`]) so that the busiest known
//!   endpoint still ranks above an unknown one.

use crate::scorer::Signals;

pub mod spec;
pub use spec::{ArgSpec, Kind, Reader, Value};

pub mod gpu_usage;
pub mod least_latency;
pub mod least_request;
pub mod lora_affinity;
pub mod prefill_cost;
pub mod prefix_cache;
pub mod prefix_hash_bounded;
pub mod random;
pub mod round_robin;

/// What a policy sees of one scheduling call. Per-endpoint arrays are indexed by slot.
pub struct Ctx<'a> {
    pub eps: &'a [Signals],
    /// Estimated load per slot (see [`Signals::load`]): `INFINITY` when unknown.
    pub load: &'a [f64],
    /// Matched prefix fraction per slot for this request (0 when not matched).
    pub prefix: &'a [f64],
    /// The request's prompt length in prefix blocks (0 when not hashed).
    pub total_blocks: f64,
    pub request_hash: u64,
    /// Consistent-hash key: the caller's hash of the request's leading prompt blocks, else
    /// `request_hash` ([`PolicyInfo::prefix_key`] policies).
    pub prefix_key: u64,
    pub lora: Option<u32>,
    /// Number of earlier scheduling calls (round-robin's position).
    pub seq: u64,
}

pub trait Policy: Send + Sync {
    fn name(&self) -> &'static str;

    /// Keep the acceptable candidates (slots); only called for [`PolicyInfo::filter`]
    /// policies. The scorer undoes a filter that would leave none, so a filter states a
    /// preference, never an outage.
    fn filter(&self, _ctx: &Ctx, _cands: &mut Vec<u32>) {}

    /// Write one score in [0, 1] per candidate into `out` (same length as `cands`).
    fn score(&self, ctx: &Ctx, cands: &[u32], out: &mut [f64]);
}

impl std::fmt::Debug for dyn Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Numeric plugin arguments (`pluginConfig[].args`); booleans are 0/1.
#[derive(Clone, Debug, Default)]
pub struct Args(pub Vec<(String, f64)>);

impl Args {
    pub fn get(&self, key: &str) -> Option<f64> {
        self.0.iter().find(|(k, _)| k == key).map(|&(_, v)| v)
    }

    /// The argument's value, else its numeric default (None when the default is absent).
    pub fn value(&self, spec: &ArgSpec) -> Option<f64> {
        self.get(spec.name).or(spec.default.number())
    }
}

/// One registry row: a Kthena plugin name, its roles, its arguments, its constructor.
pub struct PolicyInfo {
    pub name: &'static str,
    /// May be listed under `plugins.Score` / `plugins.Filter`.
    pub score: bool,
    pub filter: bool,
    /// Prefers endpoints that already hold the request's state (prefix, adapter): the
    /// hot-spot guard only watches configurations that have one.
    pub affinity: bool,
    /// Scores the caller's per-request prefix match ([`Ctx::prefix`]), so the caller must
    /// compute it.
    pub prefix_input: bool,
    /// Reads the request's prefix key ([`Ctx::prefix_key`]), so the caller must compute it.
    pub prefix_key: bool,
    /// Every argument that belongs to the plugin, including those the router around the
    /// scorer reads ([`Reader::Router`]); others draw a warning.
    pub args: &'static [ArgSpec],
    /// Called with arguments already checked against `args`.
    pub build: fn(&Args) -> Result<Box<dyn Policy>, String>,
}

impl PolicyInfo {
    /// A score-only plugin without arguments or special inputs.
    pub const fn score(
        name: &'static str,
        build: fn(&Args) -> Result<Box<dyn Policy>, String>,
    ) -> Self {
        PolicyInfo {
            name,
            score: true,
            filter: false,
            affinity: false,
            prefix_input: false,
            prefix_key: false,
            args: &[],
            build,
        }
    }

    pub fn arg(&self, name: &str) -> Option<&'static ArgSpec> {
        self.args.iter().find(|a| a.name == name)
    }
}

pub static REGISTRY: &[PolicyInfo] = &[
    random::INFO,
    round_robin::INFO,
    least_request::INFO,
    least_latency::INFO,
    gpu_usage::INFO,
    prefix_cache::INFO_PREFIX,
    prefix_cache::INFO_KVCACHE,
    lora_affinity::INFO,
    prefix_hash_bounded::INFO,
    prefill_cost::INFO,
];

/// Kthena plugins we recognise but do not implement: refused with this reason.
pub static REFUSED: &[(&str, &str)] = &[
    (
        "session-affinity",
        "session-affinity (sticky sessions by header) is not supported yet",
    ),
    (
        "cost-aware",
        "cost-aware (token-budget reservations) is not supported yet",
    ),
];

/// The registry row of `name`; a refused or unknown name is an error.
pub fn info(name: &str) -> Result<&'static PolicyInfo, String> {
    if let Some((_, why)) = REFUSED.iter().find(|(n, _)| *n == name) {
        return Err(format!("scheduler plugin {name:?} is refused: {why}"));
    }
    REGISTRY.iter().find(|i| i.name == name).ok_or_else(|| {
        let known: Vec<&str> = REGISTRY.iter().map(|i| i.name).collect();
        format!(
            "unknown scheduler plugin {name:?} (known: {})",
            known.join(", ")
        )
    })
}

/// Build the policy named `name` after checking `args` against its specs; also returns
/// warnings about arguments that are not the plugin's.
pub fn build(name: &str, args: &Args) -> Result<(Box<dyn Policy>, Vec<String>), String> {
    let info = info(name)?;
    let mut warnings = Vec::new();
    for (k, v) in &args.0 {
        match info.arg(k) {
            None => warnings.push(format!(
                "scheduler plugin {name:?}: argument {k:?} is ignored"
            )),
            Some(a) if a.reader == Reader::Policy => a
                .check(*v)
                .map_err(|e| format!("scheduler plugin {name:?}: {e}"))?,
            Some(_) => {}
        }
    }
    Ok(((info.build)(args)?, warnings))
}

/// Lowest score of a known value: the worst known beats unknown (0).
pub const KNOWN_FLOOR: f64 = 0.01;

/// Map a [0, 1] goodness of a known value into [KNOWN_FLOOR, 1].
#[inline]
pub fn known(v: f64) -> f64 {
    KNOWN_FLOOR + (1.0 - KNOWN_FLOOR) * v.clamp(0.0, 1.0)
}

/// Largest finite (known) cost among `cands`, at least 0.
pub fn max_known(cost: impl Fn(u32) -> f64, cands: &[u32]) -> f64 {
    cands
        .iter()
        .map(|&s| cost(s))
        .filter(|c| c.is_finite())
        .fold(0.0f64, |m, c| m.max(c))
}

/// Score of cost `c` given the candidates' `max`: unknown (non-finite) 0, else
/// `known((max - c) / max)` (1 when every known cost is 0).
#[inline]
pub fn inverse_norm_one(c: f64, max: f64) -> f64 {
    if !c.is_finite() {
        0.0
    } else if max <= 0.0 {
        1.0
    } else {
        known((max - c.max(0.0)) / max)
    }
}

/// [`inverse_norm_one`] over `cands`.
pub fn inverse_norm(cost: impl Fn(u32) -> f64, cands: &[u32], out: &mut [f64]) {
    let max = max_known(&cost, cands);
    for (o, &s) in out.iter_mut().zip(cands) {
        *o = inverse_norm_one(cost(s), max);
    }
}

/// splitmix64 finaliser: the request-id based tie-break and the random policy.
#[inline]
pub fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
pub(crate) mod testing {
    //! A tiny harness: build signals and a context, run one policy.
    use super::*;

    pub fn sig(id: u32) -> Signals {
        let mut s = Signals::new(id);
        s.stale = false;
        s.running = 0.0;
        s.waiting = 0.0;
        s.kv_usage = 0.0;
        s
    }

    pub fn run(
        p: &dyn Policy,
        eps: &[Signals],
        prefix: &[f64],
        lora: Option<u32>,
        seq: u64,
    ) -> Vec<f64> {
        run_full(p, eps, prefix, lora, seq, 0.0)
    }

    /// [`run`] for a request of `total` prompt blocks.
    pub fn run_total(p: &dyn Policy, eps: &[Signals], prefix: &[f64], total: f64) -> Vec<f64> {
        run_full(p, eps, prefix, None, 0, total)
    }

    fn run_full(
        p: &dyn Policy,
        eps: &[Signals],
        prefix: &[f64],
        lora: Option<u32>,
        seq: u64,
        total_blocks: f64,
    ) -> Vec<f64> {
        let load: Vec<f64> = eps.iter().map(|e| e.load()).collect();
        let prefix = if prefix.is_empty() {
            vec![0.0; eps.len()]
        } else {
            prefix.to_vec()
        };
        let ctx = Ctx {
            eps,
            load: &load,
            prefix: &prefix,
            total_blocks,
            request_hash: 77,
            prefix_key: 77,
            lora,
            seq,
        };
        let cands: Vec<u32> = (0..eps.len() as u32).collect();
        let mut out = vec![f64::NAN; cands.len()];
        p.score(&ctx, &cands, &mut out);
        assert!(out.iter().all(|v| (0.0..=1.0).contains(v)), "{out:?}");
        out
    }

    pub fn filter(p: &dyn Policy, eps: &[Signals], lora: Option<u32>) -> Vec<u32> {
        let load: Vec<f64> = eps.iter().map(|e| e.load()).collect();
        let prefix = vec![0.0; eps.len()];
        let ctx = Ctx {
            eps,
            load: &load,
            prefix: &prefix,
            total_blocks: 0.0,
            request_hash: 77,
            prefix_key: 77,
            lora,
            seq: 0,
        };
        let mut cands: Vec<u32> = (0..eps.len() as u32).collect();
        p.filter(&ctx, &mut cands);
        cands
    }

    pub fn make(name: &str, args: &[(&str, f64)]) -> Box<dyn Policy> {
        let args = Args(args.iter().map(|&(k, v)| (k.to_string(), v)).collect());
        build(name, &args).unwrap().0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_names_and_refusals() {
        for info in REGISTRY {
            let (p, w) = build(info.name, &Args::default()).unwrap();
            assert_eq!(p.name(), info.name);
            assert!(w.is_empty());
            assert!(info.score || info.filter);
            for (i, a) in info.args.iter().enumerate() {
                assert!(info.args[..i]
                    .iter()
                    .all(|b| b.name != a.name && b.field != a.field));
                if let Some(d) = a.default.number() {
                    assert!(a.check(d).is_ok(), "{}: default of {}", info.name, a.name);
                }
            }
        }
        assert!(build("session-affinity", &Args::default())
            .unwrap_err()
            .contains("not supported"));
        assert!(build("nope", &Args::default())
            .unwrap_err()
            .contains("known: random"));
        let (_, w) = build("gpu-usage", &Args(vec![("foo".into(), 1.0)])).unwrap();
        assert_eq!(w.len(), 1);
        // Router-read arguments are the plugin's: accepted silently, not checked here.
        let (_, w) = build("prefix-cache", &Args(vec![("balanceMisses".into(), 7.0)])).unwrap();
        assert!(w.is_empty());
        let e = build(
            "least-latency",
            &Args(vec![("TTFTTPOTWeightFactor".into(), 2.0)]),
        );
        assert!(e
            .unwrap_err()
            .contains("TTFTTPOTWeightFactor must be in [0, 1]"));
    }

    #[test]
    fn inverse_norm_unknown_is_worst() {
        let costs = [0.0, 5.0, 10.0, f64::INFINITY, f64::NAN];
        let cands: Vec<u32> = (0..5).collect();
        let mut out = [0.0; 5];
        inverse_norm(|s| costs[s as usize], &cands, &mut out);
        assert_eq!(out, [1.0, known(0.5), KNOWN_FLOOR, 0.0, 0.0]);
        inverse_norm(|_| 0.0, &cands, &mut out);
        assert_eq!(out, [1.0; 5]);
    }
}
