"""The serving runtime: vLLM instances, the router and the authenticating front, supervised, with a health endpoint."""
