"""Wire vocabulary: annotation keys, resource names and API groups, in one place; each
vendor's own words (its resource names, its annotation keys) are in ``devices/``, its
row of the vendor table.

HAMi's keys are kept byte-for-byte so that pods and nodes written for HAMi work unchanged.
"""

from __future__ import annotations

from typing import Final

SCHEDULER_NAME: Final = "vgpu-scheduler"
#: The scheduler a pod that names none gets (kube-scheduler's profile name).
DEFAULT_SCHEDULER: Final = "default-scheduler"
#: Pod phases after which a pod's containers never run again (its devices are free).
TERMINAL_PHASES: Final = frozenset({"Succeeded", "Failed"})

# --- Node annotations (written by device plugins / our agent, or by administrators; the
# vendors' own registration keys are in ``devices/``) ---
NODE_HANDSHAKE: Final = "hami.io/node-handshake"
NODE_DEVICE_CORDON: Final = "hami.io/device-cordon"
NODE_LOCK: Final = "hami.io/mutex.lock"

# --- Pod annotations written by the scheduler (the vendors' allocation keys: ``devices/``) ---
ASSIGNED_NODE: Final = "hami.io/vgpu-node"
ASSIGNED_TIME: Final = "hami.io/vgpu-time"
BIND_PHASE: Final = "hami.io/bind-phase"
BIND_TIME: Final = "hami.io/bind-time"
#: HAMi v2.10: the MIG instance (profile and placement) of each allocated MIG device.
MIG_ALLOCATIONS: Final = "hami.io/vgpu-mig-allocations"

# --- Pod annotations written by users (the vendors' own: ``devices/``) ---
NODE_SCHEDULER_POLICY: Final = "hami.io/node-scheduler-policy"
GPU_SCHEDULER_POLICY: Final = "hami.io/gpu-scheduler-policy"
DEVICE_SCORING_WEIGHTS: Final = "hami.io/device-scoring-weights"

# --- Environment variables injected by admission ---
ENV_TASK_PRIORITY: Final = "CUDA_TASK_PRIORITY"
ENV_CORE_UTILIZATION_POLICY: Final = "GPU_CORE_UTILIZATION_POLICY"
ENV_VISIBLE_DEVICES: Final = "NVIDIA_VISIBLE_DEVICES"
#: A container env that tells the device plugin to leave HAMi-core out (no limits).
ENV_DISABLE_CONTROL: Final = "CUDA_DISABLE_CONTROL"

# --- Our own API ---
CRD_GROUP: Final = "vgpu-operator.io"
CRD_VERSION: Final = "v1alpha1"
DEVICE_INVENTORY_KIND: Final = "DeviceInventory"
DEVICE_INVENTORY_PLURAL: Final = "deviceinventories"
DEVICE_INVENTORY_SHORT: Final = "dinv"
#: The label on what the agent creates (its inventory, its node's Lease).
MANAGED_BY_LABEL: Final = "app.kubernetes.io/managed-by"
MANAGED_BY_AGENT: Final = "vgpu-operator-agent"

# --- Kubernetes' own labels ---
#: Upstream's label on a namespace whose ResourceClaims may ask adminAccess.
ADMIN_ACCESS_LABEL: Final = "resource.kubernetes.io/admin-access"
