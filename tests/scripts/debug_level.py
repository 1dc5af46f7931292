"""Test script: the c10d debug level, which ``import torch.distributed`` reads from
TORCH_DISTRIBUTED_DEBUG once (a rank forked from a server that imported torch keeps the server's)."""

import torch.distributed as dist

print(dist.get_debug_level().name)
