"""vgpu-operator: GPU sharing for Kubernetes, compatible with HAMi annotations."""

__version__ = "0.1.0"
