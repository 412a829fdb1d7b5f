//! `random`: a uniform score per (request, endpoint), derived from the request-id hash so
//! that a request's order is reproducible (retries see the same list).

use super::{mix64, Args, Ctx, Policy, PolicyInfo};

pub const INFO: PolicyInfo = PolicyInfo::score("random", build);

fn build(_: &Args) -> Result<Box<dyn Policy>, String> {
    Ok(Box::new(Random))
}

pub struct Random;

impl Policy for Random {
    fn name(&self) -> &'static str {
        "random"
    }

    fn score(&self, ctx: &Ctx, cands: &[u32], out: &mut [f64]) {
        // A different mix than the tie-break's, so the two are not the same order.
        let salt = mix64(ctx.request_hash ^ 0x5241_4E44_4F4D);
        for (o, &s) in out.iter_mut().zip(cands) {
            let r = mix64(salt ^ u64::from(ctx.eps[s as usize].id));
            *o = (r >> 11) as f64 / (1u64 << 53) as f64;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;

    #[test]
    fn uniform_and_deterministic() {
        let eps: Vec<_> = (0..1000).map(sig).collect();
        let p = make("random", &[]);
        let a = run(&*p, &eps, &[], None, 0);
        assert_eq!(a, run(&*p, &eps, &[], None, 5)); // depends on the request, not the call
        let mean = a.iter().sum::<f64>() / a.len() as f64;
        assert!((0.45..0.55).contains(&mean), "{mean}");
        let argmax = |v: &[f64]| (0..v.len()).max_by(|&i, &j| v[i].total_cmp(&v[j])).unwrap();
        // Many request ids pick many different endpoints.
        let picks: std::collections::HashSet<usize> = (0..50u64)
            .map(|h| {
                let load: Vec<f64> = eps.iter().map(|e| e.load()).collect();
                let prefix = vec![0.0; eps.len()];
                let ctx = super::super::Ctx {
                    eps: &eps,
                    load: &load,
                    prefix: &prefix,
                    total_blocks: 0.0,
                            request_hash: h,
                    prefix_key: h,
                    lora: None,
                    seq: 0,
                };
                let cands: Vec<u32> = (0..eps.len() as u32).collect();
                let mut out = vec![0.0; cands.len()];
                p.score(&ctx, &cands, &mut out);
                argmax(&out)
            })
            .collect();
        assert!(picks.len() > 40);
    }
}
