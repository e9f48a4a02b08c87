"""The dialects: the two ways a pod asks for GPU shares, each read and fitted on one
node here. ``annotation`` is HAMi's annotation protocol; ``claims`` is DRA (ResourceClaims
on ResourceSlices), whose Fit is the annotation path's Fit on the devices a request may use,
so ``claims`` may import ``annotation`` and never the reverse.

A dialect imports only the engine's words (the modules at the top of ``scheduling/``) and
the rooms below it (``policies``, ``mig``, ``cel``); the books and the cycle import it.
"""

from vgpu_operator.scheduling.dialects import annotation, claims

__all__ = ["annotation", "claims"]
