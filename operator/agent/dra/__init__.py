"""The node agent as a DRA driver: its cards as a ResourceSlice pool (``publisher``,
``shapes``), and kubelet's DRA plugin preparing claims with HAMi-core's limits through CDI
(``plugin``, ``prepare``, ``cdi``, ``runner``). ``dra_pb2*`` and ``pluginregistration_pb2*``
are generated from the vendored protos in ``proto/`` (``make deviceplugin-api``)."""
