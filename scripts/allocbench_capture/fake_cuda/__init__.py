"""Fake CUDA: torch.cuda answering as a one-GPU machine (an H100 80 GB) without a driver.

device.py's ``_fake_cuda_api`` installs it all; each module holds one part of the runtime:
streams and events, CUDA graphs and memory pools, generators, constructors from data, fake
tensors' copies and data pointers, nn modules whose CUDA paths need the driver, checkpoints
(save/load), and what starts other processes."""
