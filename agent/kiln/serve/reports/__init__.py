"""What the agent reports: its state, /health, /status and /metrics, the self-check, and readiness to systemd."""
