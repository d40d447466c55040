"""`kiln doctor`: can this machine's GPU stack run vLLM? Driver, fabric, memory health, links, disk and /dev/shm."""
