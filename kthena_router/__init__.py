"""kthena_router: an OpenAI-compatible router for LLM engines, drop-in for Kthena."""
