"""Training: losses, the sharded training loop (`trainer.fit`), checkpoints (one orbax wrapper),
distillation teachers (saved models: `export.saved_model`)."""
