"""Adapters to the Kubernetes API: the only importers of kubernetes_asyncio.

Import the submodules by name (``from vgpu_operator.kube import client, inventory``);
everything they return to callers is plain dicts or this project's own models.
"""
