"""The hardware check behind ``make gpu-check`` (docs/hardware.md).

On a machine with an NVIDIA GPU and no network it runs the node agent's own code against
the real card, compares what it reads with ``nvidia-smi``, drives the device plugin's
Allocate, builds HAMi-core from the pinned source and measures its limits, and exercises
MIG; every step ends as pass, fail or skip with its reason, inside one time budget, and
the results are written as a report. Without a GPU (``--backend sim:NAME``) the same steps
run on a simulated machine and the GPU-only ones are skipped, saying so.
"""
