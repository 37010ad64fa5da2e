"""fbench's reference backend: a plain PyTorch training loop, no framework around it."""
