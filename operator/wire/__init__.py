"""The shapes of what the operator and the agent read from and write to the API server.

TypedDicts, not classes: the objects stay the plain dicts the API server sends (a watch
event is decoded once and handed on, never copied into models), and mypy checks every
field we read or write against these declarations. Only the fields this project uses
are declared; ``total=False`` because the API server leaves out empty fields, so every
read of an optional field still says what it does when the field is missing.

At the bottom of the layers (``.importlinter``): the engine may import these shapes
without depending on the API adapters (``kube/``). ``core`` has every object's metadata,
pods, nodes, quotas, budgets, PodGroups and our own kinds; ``dra`` the DRA kinds.
"""

from vgpu_operator.wire.core import *  # noqa: F403
from vgpu_operator.wire.dra import *  # noqa: F403
