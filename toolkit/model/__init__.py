"""The model layer: where a checkpoint comes from and what it computes."""
