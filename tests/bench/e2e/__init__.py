"""The end-to-end benchmark of issue 12 (``make bench`` runs it after the micro-benchmarks).

The tests' control plane (kube-apiserver, etcd, KWOK) with a thousand KWOK GPU nodes whose
DeviceInventories are built by the agent's own code over simulated machines; the operator
as its own process; bursts and steady arrivals of GPU pods; in the same run and cluster
the baselines (a bare client binding pre-decided pods, and kube-scheduler at its default
and at raised client QPS placing the equivalent whole-GPU pods through ``nvidia.com/gpu``);
a correctness recount after every run; faults; and docs/benchmarks.md with its plots.

Figures are reported, never asserted: they depend on the machine. ``tests/integration/
test_bench_e2e.py`` runs a small version for correctness only.
"""
