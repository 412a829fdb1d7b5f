"""Session stickiness: Kthena's ModelRoute.spec.sessionSticky, enforced.

A request whose route has `sessionSticky` and whose first non-empty source gives a key is
sent, by preference, to the endpoint its key was last served by (a soft preference: the
endpoint must still be a usable candidate of the route). The store is the router
configuration's `sessionSticky.backend`: memory (a table shared by the router's workers)
or redis (shared by several routers). Operator documentation: docs/session.md.
"""

from .affinity import Pin, SessionAffinity, prefer_first
from .config import RedisStoreSettings, StickySettings, parse_session_sticky

__all__ = ["Pin", "RedisStoreSettings", "SessionAffinity", "StickySettings", "parse_session_sticky",
           "prefer_first"]
