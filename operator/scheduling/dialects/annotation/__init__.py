"""The annotation dialect (HAMi's protocol): what the mutating webhook does to a
pod (``admission``), Fit of one container on a node's cards (``fit``), one pod on one node,
booking as it goes (``placement``), and Fit judged by classes of identical cards for a
pod's verdict (``card_classes``).

Others use what ``__all__`` names.
"""

from vgpu_operator.scheduling.dialects.annotation.admission import AdmissionResult, admit
from vgpu_operator.scheduling.dialects.annotation.card_classes import (
    UNJUDGED,
    NodeProfile,
    Simple,
    profile,
)
from vgpu_operator.scheduling.dialects.annotation.fit import (
    CardPick,
    FitOptions,
    QuotaCheck,
    fit_container,
)
from vgpu_operator.scheduling.dialects.annotation.placement import (
    Booking,
    Job,
    Outcome,
    Summary,
    book,
    collapse,
    fit_pod,
    shift,
)

__all__ = [
    "UNJUDGED",
    "AdmissionResult",
    "Booking",
    "CardPick",
    "FitOptions",
    "Job",
    "NodeProfile",
    "Outcome",
    "QuotaCheck",
    "Simple",
    "Summary",
    "admit",
    "book",
    "collapse",
    "fit_container",
    "fit_pod",
    "profile",
    "shift",
]
