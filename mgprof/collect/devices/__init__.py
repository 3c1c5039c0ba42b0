"""What the devices did: NVML, the samplers, device identity and facts, memory."""
