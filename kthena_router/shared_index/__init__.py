"""`sharedPrefixIndex`: dispatch-time prefix ownership shared by router replicas through Redis
(an approximate index, as llm-d's kv-cache manager keeps one). Design: docs/scale-out.md."""
