"""Who is calling: JWT and API-key authentication, and the identity the rest of the
request path (rate limits, fair queuing, session stickiness) keys on."""
