"""Token rate limits: Kthena's ModelRoute.spec.rateLimit and the router configuration's
`rateLimits` (tenants, users, API keys, request counts, prompt caps), local or in Redis."""
