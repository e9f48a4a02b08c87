"""The engine: pure scheduling (no Kopf, no API client), a house of rooms.

Each room is a sub-package whose ``__init__.py`` is its face (what the other rooms may
use); a room imports only the rooms on the floors below it (``.importlinter``,
"The engine's rooms"). From the top down:

- ``defrag``, ``gangs``: defragmentation plans; PodGroups decided as one unit.
- ``cycle``: the engine's face (``cluster.ClusterState``) and one decision
  (``decision.Cycle``): the pod read once, the node gate and walk, verdicts, the trials.
- ``books``: the cluster as the engine knows it, its one read view and writer, overlays.
- ``preemption``, ``dialects``: the rules of preemption; the two dialects a pod speaks
  (``annotation``, HAMi's; ``claims``, DRA), each read and fitted on one node.
- the modules here: the engine's words (pod keys, reasons, kube-scheduler's node checks,
  the Node annotations read, the vendor table, namespace quotas).
- ``policies``, ``mig``, ``cel``: card and node orders; MIG instances; CEL selectors.
"""
