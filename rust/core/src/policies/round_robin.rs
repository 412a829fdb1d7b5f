//! `round-robin`: the candidate at position `seq mod n` scores 1, the next ones less, so
//! the ordered list rotates by one endpoint per scheduling call.

use super::{Args, Ctx, Policy, PolicyInfo};

pub const INFO: PolicyInfo = PolicyInfo::score("round-robin", build);

fn build(_: &Args) -> Result<Box<dyn Policy>, String> {
    Ok(Box::new(RoundRobin))
}

pub struct RoundRobin;

impl Policy for RoundRobin {
    fn name(&self) -> &'static str {
        "round-robin"
    }

    fn score(&self, ctx: &Ctx, cands: &[u32], out: &mut [f64]) {
        let n = cands.len();
        if n == 0 {
            return;
        }
        let first = (ctx.seq % n as u64) as usize;
        for (p, o) in out.iter_mut().enumerate() {
            *o = 1.0 - ((p + n - first) % n) as f64 / n as f64;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;

    #[test]
    fn rotates() {
        let eps: Vec<_> = (0..4).map(sig).collect();
        let p = make("round-robin", &[]);
        assert_eq!(run(&*p, &eps, &[], None, 0), [1.0, 0.75, 0.5, 0.25]);
        assert_eq!(run(&*p, &eps, &[], None, 5), [0.25, 1.0, 0.75, 0.5]);
    }
}
