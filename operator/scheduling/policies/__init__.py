"""The policies room: how cards and nodes are ordered. GPU and node policies and
their scores (``policies``), topology-aware card choice (``topology``), fragmentation as
FGD measures it (``fragmentation``), stranded memory (``stranded``) and the node layer of
configuration, an administrator's Node annotations (``node_layer``).

Floor 1 of the engine: it imports no other room.
"""
