"""Training data: the token-shard format and its loader, and `llmtrain prepare` (its inputs; one machine
or an Indexed Job)."""
