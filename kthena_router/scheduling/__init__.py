"""Scheduling: Kthena's routerConfiguration, prompt rendering for prefix matching,
and local tokenization for kvcache-aware. The Rust core (`_core.Scorer`, `PrefixIndex`,
`KvOwnership`) does the per-request work; this package prepares its inputs."""
