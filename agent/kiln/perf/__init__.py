"""The performance engine: workloads, step times, the continuous-batching simulator and predictions."""
