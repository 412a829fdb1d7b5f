"""Prefill/decode disaggregation: topology (which endpoint plays which role in which group),
pairing (decode first, then a prefill of its group), and the two-hop dispatch per connector."""
