"""How the operator registers its webhook itself (Kopf's managed configuration)."""

from __future__ import annotations

from typing import Any

from vgpu_operator.control.options import OperatorOptions, WebhookOptions
from vgpu_operator.handlers.app import WEBHOOK_ID, OperatorApp, build_registry


def test_the_webhook_says_it_writes_nothing_in_a_dry_run() -> None:
    """It makes ResourceClaimTemplates (DRA namespaces), never in a dry run: Kopf writes
    ``sideEffects: NoneOnDryRun`` for a handler with side effects (issue 33 item 6)."""
    app = OperatorApp(OperatorOptions(webhook=WebhookOptions(port=0), metrics_port=None))
    registry = build_registry(app)
    webhooks: Any = registry._webhooks  # Kopf keeps them there; no public accessor
    [handler] = [h for h in webhooks.get_all_handlers() if h.id == WEBHOOK_ID]
    assert handler.side_effects is True
