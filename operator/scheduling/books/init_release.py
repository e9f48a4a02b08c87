"""When a pod's init containers stop holding their devices (HAMi v2.10's release).

A pod whose init containers ask for more than its app containers is booked at the peak
(hami-semantics §4.3). HAMi v2.10 shrinks the booking to the app containers once every
init container has succeeded, read from ``status.initContainerStatuses``: a field only
the node's kubelet writes (through the ``pods/status`` subresource), never the pod's
owner. The books follow the status as it stands rather than latching the release: an
init container that runs again (kubelet re-runs them when it recreates the pod's
sandbox) holds its share again, so a rebuild of the books after a restart books what
each pod needs now.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vgpu_operator.wire import Pod


def init_containers_done(pod: Pod) -> bool:
    """True when the pod has init containers and each of them, by name, has terminated
    with exit code 0 (HAMi's ``AllInitContainersSucceeded``, stricter in that every init
    container of the spec must be reported: a status listing only some proves nothing).

    A restartable init container (a sidecar) never terminates while the pod runs, so a
    pod with one keeps its peak, as in HAMi.
    """
    spec = pod.get("spec")
    init = spec.get("initContainers") if isinstance(spec, Mapping) else None
    if not isinstance(init, list) or not init:
        return False
    status = pod.get("status")
    reported = status.get("initContainerStatuses") if isinstance(status, Mapping) else None
    if not isinstance(reported, list):
        return False
    outcomes: dict[Any, bool] = {}
    for entry in reported:
        if isinstance(entry, Mapping):
            name = entry.get("name")
            # A name reported twice counts as done only if both say so.
            outcomes[name] = outcomes.get(name, True) and _succeeded(entry.get("state"))
    wanted = [c.get("name") if isinstance(c, Mapping) else None for c in init]
    return all(isinstance(n, str) and outcomes.get(n, False) for n in wanted)


def _succeeded(state: Any) -> bool:
    if not isinstance(state, Mapping):
        return False
    terminated = state.get("terminated")
    if not isinstance(terminated, Mapping):
        return False
    code = terminated.get("exitCode")
    return isinstance(code, int) and not isinstance(code, bool) and code == 0
