"""The operator process's Kopf layer (the only Kopf user): thin I/O and wiring.

``app`` registers the handlers and feeds what they receive to the scheduling runtime in
``vgpu_operator.control``; ``runtime`` runs it; ``admission`` turns the webhook's
mutated pod into Kopf's patch. The logic lives below, testable without Kopf or a cluster.

No module here registers anything on import: ``app.build_registry`` binds the handlers
to one ``app.OperatorApp``, so several operators can share a process.
"""
