"""The workers together: process group, device mesh and FSDP2, the preflight health check, EFA memory pinning."""
