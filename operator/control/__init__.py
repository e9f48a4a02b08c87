"""The operator's scheduling runtime, with no Kopf in it.

``feed`` turns watched objects into engine inputs, queue entries and wake-ups; ``queue``
keeps waiting pods with backoff and parking; ``worker`` runs decide -> bind -> confirm;
``versions`` drops stale events; ``pod_facts`` reads pods; ``leadership`` follows Kopf's
peering; ``reporting`` writes conditions and Events; ``serving`` serves metrics and
probes; ``options`` holds the operator's settings; ``operator`` assembles them into one
operator. ``vgpu_operator.handlers`` hands it to Kopf.
"""
