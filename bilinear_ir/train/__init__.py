"""Training: losses, the sharded trainer (train_and_evaluate), checkpoints (one orbax wrapper)."""
