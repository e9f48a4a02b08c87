"""``vgpu-operator demo``: the whole system on one machine, from start to finish.

It starts a throw-away control plane (etcd, kube-apiserver and KWOK on loopback) and
creates KWOK nodes shaped like real GPU servers. For each node it runs the node agent
over a simulated machine (``agent/machines/``), so every DeviceInventory is written
exactly as the agent DaemonSet writes it, heartbeats included. It then starts the
operator as its own process (``vgpu-operator run``), applies the manifests of
``examples/`` in file order, waits until every pod is bound or reported as waiting,
then plays ``examples/preemption/`` one file at a time (a batch job fills a card, an
urgent pod preempts it), prints where each pod went, why the others wait and who was
preempted, and stops everything.

The admission webhook is not installed: the example pods name the scheduler
themselves, and the engine applies the admission defaults when it schedules."""

from vgpu_operator.demo.render import render_result
from vgpu_operator.demo.result import DemoResult, PlacedPod
from vgpu_operator.demo.story import RunningDemo, demo_command, run_demo

__all__ = ["DemoResult", "PlacedPod", "RunningDemo", "demo_command", "render_result", "run_demo"]
