"""`kiln bench`: load sweeps with vLLM's own benchmark client, reports, cost per million tokens, comparisons."""
