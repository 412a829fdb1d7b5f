//! `lora-affinity`: for a request naming an adapter, keep (filter) or prefer (score 1)
//! endpoints that have it loaded; next best are endpoints with room to load it (fewer
//! loaded than `max_loras`, score 0.5); others score 0. As a filter it falls back to
//! "room to load" when no endpoint has the adapter. Base-model requests score 1 everywhere.
//! The adapter sets come from /v1/models and are kept while an endpoint is stale (they
//! change rarely; load signals do not).

use super::{Args, Ctx, Policy, PolicyInfo};
use crate::scorer::Signals;

pub const INFO: PolicyInfo = PolicyInfo {
    filter: true,
    affinity: true,
    ..PolicyInfo::score("lora-affinity", build)
};

fn build(_: &Args) -> Result<Box<dyn Policy>, String> {
    Ok(Box::new(LoraAffinity))
}

pub struct LoraAffinity;

fn has(e: &Signals, lora: u32) -> bool {
    e.loras.contains(&lora)
}

fn has_room(e: &Signals) -> bool {
    (e.loras.len() as u64) < u64::from(e.max_loras)
}

impl Policy for LoraAffinity {
    fn name(&self) -> &'static str {
        "lora-affinity"
    }

    fn filter(&self, ctx: &Ctx, cands: &mut Vec<u32>) {
        let Some(l) = ctx.lora else { return };
        if cands.iter().any(|&s| has(&ctx.eps[s as usize], l)) {
            cands.retain(|&s| has(&ctx.eps[s as usize], l));
        } else {
            cands.retain(|&s| has_room(&ctx.eps[s as usize]));
        }
    }

    fn score(&self, ctx: &Ctx, cands: &[u32], out: &mut [f64]) {
        for (o, &s) in out.iter_mut().zip(cands) {
            let e = &ctx.eps[s as usize];
            *o = match ctx.lora {
                None => 1.0,
                Some(l) if has(e, l) => 1.0,
                Some(_) if has_room(e) => 0.5,
                Some(_) => 0.0,
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;

    #[test]
    fn loaded_then_room() {
        let mut eps: Vec<_> = (0..3).map(sig).collect();
        eps[0].loras = vec![1, 2];
        eps[0].max_loras = 2;
        eps[1].loras = vec![3];
        eps[1].max_loras = 2;
        eps[2].loras = vec![4, 5];
        eps[2].max_loras = 2;
        let p = make("lora-affinity", &[]);
        assert_eq!(run(&*p, &eps, &[], Some(2), 0), [1.0, 0.5, 0.0]);
        assert_eq!(run(&*p, &eps, &[], None, 0), [1.0, 1.0, 1.0]);
        assert_eq!(filter(&*p, &eps, Some(2)), vec![0]);
        assert_eq!(filter(&*p, &eps, Some(9)), vec![1]); // nobody has it: room to load
        assert_eq!(filter(&*p, &eps, None), vec![0, 1, 2]);
    }
}
