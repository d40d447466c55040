"""The public front: nginx in front of the router, its TLS certificate (own, ACME or self-signed) and the API keys."""
