"""Checkpoints: the DCP checkpointer (local/FSx and S3 stores), its direct reader, and what a checkpoint may contain."""
