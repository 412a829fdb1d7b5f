"""Engine simulator: simulated vLLM/SGLang engines behind HTTP (shares no code with kthena_router)."""
