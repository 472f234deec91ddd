"""The process and what it runs on, decided once at start-up and asked by everything above.

:mod:`.runtime` (device, precision, memory format, the process group), :mod:`.distributed` (a peer that is
gone), :mod:`.slurm` (the rendezvous of an ``srun`` step), :mod:`.gpu_affinity` (the cores near a GPU),
:mod:`.machine` (the CPU, GPU and software a figure ran on), :mod:`.host_memory` (glibc's allocator set for
training on the CPU), :mod:`.signals` (SIGTERM, SIGUSR1, Ctrl-C),
:mod:`.cli` (how a script ends: a user's mistake is one line and exit code 2), :mod:`.worker_shim` (a
multiproc.py worker's first moments, started by path).  Only runtime and distributed import torch when
imported: the command lines use the rest before torch is loaded.

May import: errors.
"""
