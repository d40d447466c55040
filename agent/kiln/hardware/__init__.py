"""What the machine has: GPUs, their links, the host; read through one NVML adapter."""
