"""The router's request path: body handling, upstream pool, forwarding, SSE relay."""
