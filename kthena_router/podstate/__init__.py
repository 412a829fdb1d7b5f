"""One shared state per router pod: a hub process scrapes, probes and relays prefix-index
inserts once per pod; workers read the results from a unix socket (docs/pod-state.md)."""
