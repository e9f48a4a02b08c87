"""The operator process: Kopf handlers around the scheduling engine (the only Kopf user).

Thin I/O lives in ``app`` (handlers, wiring, full listings), ``runtime`` (running it) and
``serving`` (metrics and probes); the logic is in small modules testable without Kopf or
a cluster: ``feed`` (objects -> engine, queue and wake-ups), ``queue`` (backoff and
parking), ``worker`` (decide -> bind -> confirm), ``versions`` (stale-event guard),
``pod_facts``, ``leadership`` (peering), ``reporting``, ``admission``.

No module here registers anything on import: ``app.build_registry`` binds the handlers
to one ``app.OperatorApp``, so several operators can share a process.
"""
