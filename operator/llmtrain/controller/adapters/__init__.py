"""The controller's I/O adapters: the API calls, the watches' caches, rank 0's scrape, the lease,
the metrics; what turns the world into a snapshot (observe) and a plan into writes (act)."""
