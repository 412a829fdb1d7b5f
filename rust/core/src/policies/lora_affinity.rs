//! `lora-affinity`: for a request naming an adapter, keep (filter) or prefer (score)
//! endpoints that have it loaded; next best are endpoints with room to load it (fewer
//! loaded than `max_loras`, score 0.5); others score 0. As a filter it falls back to
//! "room to load" when no endpoint has the adapter. Base-model requests score 1 everywhere.
//! The adapter sets come from /v1/models and are kept while an endpoint is stale (they
//! change rarely; load signals do not).
//!
//! /v1/models lists the adapters an engine has registered, which can be more than the
//! `max_loras` its batch holds at once (vLLM's --max-cpu-loras): a request whose adapter
//! would be one too many in the batch waits for another adapter's requests to drain.
//! Among endpoints that have the adapter, and whose `max_loras` is known, the score
//! follows the adapters this router has in flight there (this worker's and, relayed by
//! the pod-state hub, its sibling workers'): the adapter already in the batch 1, a free
//! slot 0.75, a full batch 0.25 (in flight but over-subscribed: 0.5).

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
                Some(l) if has(e, l) => slot_score(e, l),
                Some(_) if has_room(e) => 0.5,
                Some(_) => 0.0,
            };
        }
    }
}

/// How soon the engine's batch can take a request for adapter `l` it has loaded.
fn slot_score(e: &Signals, l: u32) -> f64 {
    if e.max_loras == 0 {
        return 1.0; // batch size unknown
    }
    let active = e.lora_active() as u64;
    let max = u64::from(e.max_loras);
    match (e.lora_in_flight_of(l) > 0, active <= max) {
        (true, true) => 1.0,
        (true, false) => 0.5,
        (false, _) if active < max => 0.75,
        (false, _) => 0.25,
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
        // loaded with a free batch slot (nothing in flight) 0.75; room to load 0.5
        assert_eq!(run(&*p, &eps, &[], Some(2), 0), [0.75, 0.5, 0.0]);
        assert_eq!(run(&*p, &eps, &[], None, 0), [1.0, 1.0, 1.0]);
        assert_eq!(filter(&*p, &eps, Some(2)), vec![0]);
        assert_eq!(filter(&*p, &eps, Some(9)), vec![1]); // nobody has it: room to load
        assert_eq!(filter(&*p, &eps, None), vec![0, 1, 2]);
    }

    #[test]
    fn batch_slots_from_in_flight_adapters() {
        // all four have adapter 1 registered; the batch holds 2 adapters
        let mut eps: Vec<_> = (0..5).map(sig).collect();
        for e in &mut eps {
            e.loras = vec![1, 2, 3, 4];
            e.max_loras = 2;
        }
        eps[0].lora_in_flight = vec![(1, 3)]; // in the batch
        eps[1].lora_in_flight = vec![(2, 1)]; // a free slot
        eps[2].lora_in_flight = vec![(2, 1), (3, 2)]; // full
        eps[3].lora_in_flight = vec![(1, 1), (2, 1), (3, 1)]; // in flight, over-subscribed
        eps[4].max_loras = 0; // batch size unknown
        let p = make("lora-affinity", &[]);
        assert_eq!(run(&*p, &eps, &[], Some(1), 0), [1.0, 0.75, 0.25, 0.5, 1.0]);
        assert_eq!(run(&*p, &eps, &[], None, 0), [1.0; 5]);
        assert_eq!(filter(&*p, &eps, Some(1)), vec![0, 1, 2, 3, 4]); // the filter keeps registration
    }

    #[test]
    fn sibling_workers_adapters_count_in_the_batch() {
        let mut eps: Vec<_> = (0..3).map(sig).collect();
        for e in &mut eps {
            e.loras = vec![1, 2, 3, 4];
            e.max_loras = 2;
        }
        eps[0].lora_remote = vec![(1, 1)]; // another worker's request: adapter 1 in the batch
        eps[1].lora_in_flight = vec![(2, 1)];
        eps[1].lora_remote = vec![(3, 1)]; // full between the two workers
        eps[2].lora_in_flight = vec![(2, 1)];
        eps[2].lora_remote = vec![(2, 4)]; // the same adapter: one slot, one free
        let p = make("lora-affinity", &[]);
        assert_eq!(run(&*p, &eps, &[], Some(1), 0), [1.0, 0.25, 0.75]);
        assert_eq!(eps[2].lora_in_flight_of(2), 5);
    }
}
