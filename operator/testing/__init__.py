"""Test support for vgpu-operator (modelled on ``kopf.testing``).

``vgpu_operator.testing.controlplane`` starts a real etcd + kube-apiserver (+ kwok) on loopback;
it needs the ``test`` extra (``cryptography``) and the binaries from ``make control-plane-bins``.
"""
