"""tfrun: pipeline-parallel training on torch.distributed.pipelining with per-micro-batch freezing."""
