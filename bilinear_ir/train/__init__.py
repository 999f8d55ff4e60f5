"""Training: losses, the sharded training loop (`trainer.fit`), checkpoints (one orbax wrapper),
saved models, distillation teachers."""
