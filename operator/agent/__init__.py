"""The node agent: reads a node's GPUs (NVML or a simulated machine) and reports them as
the node's DeviceInventory. Never imports Kopf; only ``agent.nvml`` imports pynvml.

Modules: ``readings`` (plain values), ``nvml`` (the reader), ``simulated`` (machine
files), ``backends``, ``health`` and ``inventory`` (pure rules), ``backoff``,
``metrics``, ``main`` (the loop), ``cli`` (the ``agent`` and ``crds`` commands).
"""
