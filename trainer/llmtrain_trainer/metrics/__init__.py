"""What the trainer reports: its Prometheus metrics, per-step throughput and MFU, and the per-step loss facts."""
