"""Fair queuing (issue 9): the `fairness` router-configuration section and the per-ModelServer
fair queue in front of the executor (gate.py; the queue itself is rust/core/src/fairq.rs)."""
