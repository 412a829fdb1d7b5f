//! `gpu-usage`: prefer lower KV-cache usage: score `known(1 - usage)` (usage clamped to
//! [0, 1]; see [`super::known`]).
//! Stale or never-scraped endpoints score 0 (unknown usage is full usage).

use super::{known, Args, Ctx, Policy, PolicyInfo};

pub const INFO: PolicyInfo = PolicyInfo::score("gpu-usage", build);

fn build(_: &Args) -> Result<Box<dyn Policy>, String> {
    Ok(Box::new(GpuUsage))
}

pub struct GpuUsage;

impl Policy for GpuUsage {
    fn name(&self) -> &'static str {
        "gpu-usage"
    }

    fn score(&self, ctx: &Ctx, cands: &[u32], out: &mut [f64]) {
        for (o, &s) in out.iter_mut().zip(cands) {
            let e = &ctx.eps[s as usize];
            *o = if e.stale || e.kv_usage.is_nan() {
                0.0
            } else {
                known(1.0 - e.kv_usage.clamp(0.0, 1.0))
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::super::{known, KNOWN_FLOOR};

    #[test]
    fn lower_usage_better() {
        let mut eps: Vec<_> = (0..5).map(sig).collect();
        for (e, u) in eps.iter_mut().zip([0.25, 0.9, 1.5, f64::NAN, 0.0]) {
            e.kv_usage = u;
        }
        eps[4].stale = true;
        assert_eq!(
            run(&*make("gpu-usage", &[]), &eps, &[], None, 0),
            [known(0.75), known(1.0 - 0.9), KNOWN_FLOOR, 0.0, 0.0]
        );
    }
}
