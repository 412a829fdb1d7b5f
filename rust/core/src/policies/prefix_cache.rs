//! `prefix-cache` (approximate index) and `kvcache-aware` (engine KV events): score = the
//! request's matched prefix fraction on the endpoint, as supplied by the caller for this
//! request (it merges the two sources, falling back to the approximate index for endpoints
//! whose event stream is down). prefix-cache's `topKMatches` keeps only the k longest
//! matches (ties at the k-th kept). The other arguments are listed here, the one registry,
//! but read by the router around the scorer (hashing, tokenizers, KV events).

use super::{ArgSpec, Args, Ctx, Policy, PolicyInfo, Value};

/// Bytes per hashed block (Kthena: 64, about 16 tokens).
const BLOCK_BYTES: ArgSpec = ArgSpec::int("blockSizeToHash", "block_size_to_hash", Value::Int(64))
    .positive()
    .router();
/// Ours: 2048 blocks = 128 KiB of prompt (Kthena: 128 = 8 KiB, too short for RAG/agents;
/// matching is one call, so longer chains cost little).
const MAX_BLOCKS: ArgSpec =
    ArgSpec::int("maxBlocksToMatch", "max_blocks_to_match", Value::Int(2048))
        .positive()
        .router();
/// Absent = ours: each endpoint's capacity follows its engine's KV capacity (Kthena: 50000
/// entries per endpoint).
const CACHE_SIZE: ArgSpec = ArgSpec::int("maxHashCacheSize", "max_hash_cache_size", Value::Absent)
    .positive()
    .router();
/// Absent = ours: every matching endpoint is scored (Kthena: the top 5).
const TOP_K: ArgSpec = ArgSpec::int("topKMatches", "top_k_matches", Value::Absent).positive();
/// Ours: a base-model request no endpoint holds (best match < half the prompt) scores each
/// endpoint by the load its prefixes already bring instead of 0 ((max - load) / max of the
/// expected loads; crate::prefix_traffic), so a new prefix goes where its future requests
/// find the least company: by count at a cold start (as SGLang's cache-aware router's
/// smallest tree), by measured traffic once a prefix has been seen often.
const BALANCE: ArgSpec = ArgSpec::bool("balanceMisses", "balance_misses", false)
    .ours()
    .router();

/// Ours: slots (16 bytes each, rounded up to a power of two) of the index's evicted-owner
/// hint table (crate::evicted_hints; 0 = off): a block the index drops for capacity keeps
/// its last owner as a decaying hint, matched at a discount. The default is a memory
/// budget (1 MiB per worker), not a traffic size; on by measurement (docs/hard-workloads.md,
/// "Evicted-owner hints": +28% req/s with an undersized index, no change beyond noise with
/// the learned size).
const HINT_SLOTS: ArgSpec =
    ArgSpec::int("evictedHintSlots", "evicted_hint_slots", Value::Int(65_536))
        .range(0.0, 16_777_216.0)
        .ours()
        .router();

pub const INFO_PREFIX: PolicyInfo = PolicyInfo {
    affinity: true,
    prefix_input: true,
    args: &[
        BLOCK_BYTES,
        MAX_BLOCKS,
        CACHE_SIZE,
        TOP_K,
        BALANCE,
        HINT_SLOTS,
    ],
    ..PolicyInfo::score("prefix-cache", build_prefix)
};

// kvcache-aware: the tokenizers and the KV-event subscriptions are the router's (Python);
// the scoring of the matched fraction it supplies is here.
const KV_ARGS: &[ArgSpec] = &[
    // Tokens per block: must equal the engines' block size.
    ArgSpec::int("blockSizeToHash", "block_size_to_hash", Value::Int(16))
        .positive()
        .router(),
    // Ours: 128k tokens at 16 (Kthena: 128 = 2k tokens).
    ArgSpec::int("maxBlocksToMatch", "max_blocks_to_match", Value::Int(8192))
        .positive()
        .router(),
    // Kthena's remote /tokenize ports: parsed and kept, unused (we tokenize locally).
    ArgSpec::int("vllmTokenizerPort", "vllm_tokenizer_port", Value::Absent)
        .port()
        .router(),
    ArgSpec::int(
        "sglangTokenizerPort",
        "sglang_tokenizer_port",
        Value::Absent,
    )
    .port()
    .router(),
    // Ours: served model name -> tokenizer.json (a directory means <dir>/tokenizer.json).
    ArgSpec::path_map("tokenizers", "tokenizers")
        .ours()
        .router(),
    // Ours: prefix-cache granularity of the tokenizer cache, and its size per model and
    // worker (~9 bytes per token: ids + text, tails included); kvcache-aware's digest
    // memo holds tokenizerCacheTokens / blockSizeToHash blocks per tokenizer file.
    ArgSpec::int(
        "tokenizerChunkChars",
        "tokenizer_chunk_chars",
        Value::Int(4096),
    )
    .positive()
    .ours()
    .router(),
    ArgSpec::int(
        "tokenizerCacheTokens",
        "tokenizer_cache_tokens",
        Value::Int(2_000_000),
    )
    .positive()
    .ours()
    .router(),
    // Ours: the engines' PYTHONHASHSEED (vLLM's NONE_HASH); engines must run with
    // --prefix-caching-hash-algo sha256_cbor and this fixed seed for exact matching.
    ArgSpec::str("hashSeed", "hash_seed", "0").ours().router(),
    // Ours: where an endpoint publishes KV events unless its labels say otherwise
    // (kthena.io/kv-events-port, kthena.io/kv-events-replay-port); vLLM's defaults.
    ArgSpec::int("kvEventsPort", "kv_events_port", Value::Int(5557))
        .port()
        .ours()
        .router(),
    ArgSpec::int(
        "kvEventsReplayPort",
        "kv_events_replay_port",
        Value::Int(5558),
    )
    .port()
    .ours()
    .router(),
];

pub const INFO_KVCACHE: PolicyInfo = PolicyInfo {
    affinity: true,
    prefix_input: true,
    args: KV_ARGS,
    ..PolicyInfo::score("kvcache-aware", build_kv)
};

fn build_prefix(args: &Args) -> Result<Box<dyn Policy>, String> {
    Ok(Box::new(PrefixCache {
        name: "prefix-cache",
        top_k: args.value(&TOP_K).map_or(0, |k| k as usize),
    }))
}

fn build_kv(_: &Args) -> Result<Box<dyn Policy>, String> {
    Ok(Box::new(PrefixCache {
        name: "kvcache-aware",
        top_k: 0,
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
        }
        let name = "prefix-cache";
        assert_eq!(
            run(&*make(name, &[("topKMatches", 2.0)]), &eps, &frac, None, 0),
            [0.5, 0.0, 1.0, 0.0, 0.5]
        );
        assert_eq!(
            run(&*make(name, &[("topKMatches", 1.0)]), &eps, &frac, None, 0),
            [0.0, 0.0, 1.0, 0.0, 0.0]
        );
        let bad = super::Args(vec![("topKMatches".into(), 1.5)]);
        assert!(super::super::build(name, &bad).is_err());
    }
}
