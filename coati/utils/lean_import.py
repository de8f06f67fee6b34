"""Imported before `colossalai.booster`: keeps torch from starting a pool of compile-worker processes in every rank.

colossalai's booster imports modules (its fp8 kernels, bitsandbytes through GaLore) that wrap functions in
`torch.compile` at import time, and torch then warms a pool of `compile_threads` worker processes, each importing
torch again. coati compiles nothing, so on a CPU node those processes only take cores and memory from the ranks
(measured: 2.6 s of wall clock per two-process launch). A user who sets `TORCHINDUCTOR_COMPILE_THREADS` keeps it."""
import os

import torch._inductor.config as inductor_config

if "TORCHINDUCTOR_COMPILE_THREADS" not in os.environ:
    inductor_config.compile_threads = 1
