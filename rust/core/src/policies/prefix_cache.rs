//! `prefix-cache` (approximate index) and `kvcache-aware` (engine KV events): score = the
//! request's matched prefix fraction on the endpoint, as supplied by the caller for this
//! request (it merges the two sources, falling back to the approximate index for endpoints
//! whose event stream is down). `topKMatches` > 0 keeps only the k longest matches (ties
//! at the k-th kept); the hashing arguments are the caller's and accepted here.

use super::{Args, Ctx, Policy, PolicyInfo};

const PREFIX_ARGS: &[&str] = &[
    "blockSizeToHash",
    "maxBlocksToMatch",
    "maxHashCacheSize",
    "topKMatches",
];

pub const INFO_PREFIX: PolicyInfo = PolicyInfo {
    name: "prefix-cache",
    known_args: PREFIX_ARGS,
    build: build_prefix,
};
pub const INFO_KVCACHE: PolicyInfo = PolicyInfo {
    name: "kvcache-aware",
    known_args: PREFIX_ARGS,
    build: build_kv,
};

fn top_k(args: &Args) -> Result<usize, String> {
    match args.get("topKMatches") {
        None => Ok(0),
        Some(k) if k >= 0.0 && k.fract() == 0.0 => Ok(k as usize),
        Some(k) => Err(format!(
            "topKMatches must be a non-negative integer, got {k}"
        )),
    }
}

fn build_prefix(args: &Args) -> Result<Box<dyn Policy>, String> {
    Ok(Box::new(PrefixCache {
        name: "prefix-cache",
        top_k: top_k(args)?,
    }))
}

fn build_kv(args: &Args) -> Result<Box<dyn Policy>, String> {
    Ok(Box::new(PrefixCache {
        name: "kvcache-aware",
        top_k: top_k(args)?,
    }))
}

pub struct PrefixCache {
    name: &'static str,
    top_k: usize,
}

impl Policy for PrefixCache {
    fn name(&self) -> &'static str {
        self.name
    }

    fn is_affinity(&self) -> bool {
        true
    }

    fn score(&self, ctx: &Ctx, cands: &[u32], out: &mut [f64]) {
        let mut matched = 0;
        for (o, &s) in out.iter_mut().zip(cands) {
            *o = ctx.prefix[s as usize].clamp(0.0, 1.0);
            matched += usize::from(*o > 0.0);
        }
        if self.top_k == 0 || matched <= self.top_k {
            return;
        }
        let mut vals: Vec<f64> = out.iter().copied().filter(|&v| v > 0.0).collect();
        let (_, kth, _) = vals.select_nth_unstable_by(self.top_k - 1, |a, b| b.total_cmp(a));
        let kth = *kth;
        for o in out.iter_mut() {
            if *o < kth {
                *o = 0.0;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;

    #[test]
    fn score_is_matched_fraction_and_top_k() {
        let eps: Vec<_> = (0..5).map(sig).collect();
        let frac = [0.5, 0.0, 1.0, 0.25, 0.5];
        for name in ["prefix-cache", "kvcache-aware"] {
            assert_eq!(run(&*make(name, &[]), &eps, &frac, None, 0), frac);
            assert_eq!(
                run(&*make(name, &[("topKMatches", 2.0)]), &eps, &frac, None, 0),
                [0.5, 0.0, 1.0, 0.0, 0.5]
            );
            assert_eq!(
                run(&*make(name, &[("topKMatches", 1.0)]), &eps, &frac, None, 0),
                [0.0, 0.0, 1.0, 0.0, 0.0]
            );
        }
        let bad = super::Args(vec![("topKMatches".into(), 1.5)]);
        assert!(super::build_prefix(&bad).is_err());
    }
}
