"""Turn a plan into what runs: vLLM argv and environment, and systemd units."""
