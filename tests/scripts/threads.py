"""Test script: the OpenMP threads of a rank, as its environment asks and as torch uses them."""

import os

import torch

print(f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')} torch threads={torch.get_num_threads()}")
