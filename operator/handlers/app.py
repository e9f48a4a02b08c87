"""The operator's Kopf face: start-up, clean-up, login, the mutating webhook, peering.

``OperatorApp`` holds what Kopf needs before start-up and the operator that start-up
assembles (``control/operator.py``), and has the handlers Kopf calls; ``build_registry``
binds them to one instance on a registry of its own, so two operators can run in one
process (tests of restarts and peering) without sharing state. Kopf does what it does
well and nothing per object: it stores nothing on the objects (no progress annotations,
no finalizers) and watches none of the kinds the engine reads (``control/watching.py``
does; ``docs/architecture.md`` says why).

Kopf's loop is the serving loop: the webhook, peering, login and the HTTP server
(``/metrics``, ``/healthz``, ``/readyz``) are answered here, and the operator runs on a
thread of its own (``control/scheduling_thread.py``), so that no decision delays an
answer. The webhook reads the engine through its ``admission_view`` only, and speaks to
the API server with a client of this loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any, cast

import kopf
import structlog

from vgpu_operator.control import admission as answers
from vgpu_operator.control import leadership, operator, scheduling_thread, serving
from vgpu_operator.control.options import OperatorOptions
from vgpu_operator.control.webhook_tls import prepare_webhook_tls, tls_target
from vgpu_operator.handlers import admission
from vgpu_operator.kube import client
from vgpu_operator.kube.requests import ApiClient
from vgpu_operator.metrics import OperatorMetrics
from vgpu_operator.wire import Pod

log = structlog.get_logger("vgpu_operator.operator")

#: How often Kopf's webhook server re-reads its certificate files (a hash of three files).
_CERT_FILE_CHECK_S = 5.0


class ServingError(Exception):
    """The HTTP server could not start (its port is taken); the message says what to do."""


class OperatorApp:
    """The operator's process as Kopf sees it (created before Kopf starts): the
    peering identity and priority Kopf is given, the metrics and the HTTP server, and
    the operator, which start-up assembles complete on the scheduling thread
    (``running``); until then the webhook answers ``answers.NotReady``."""

    def __init__(self, options: OperatorOptions) -> None:
        self.options = options
        self.identity = operator.make_identity()
        self.priority = (
            options.priority
            if options.priority is not None
            else leadership.peering_priority(time.time())
        )
        self.metrics = OperatorMetrics()
        self._phase: answers.PodAdmission | answers.NotReady = answers.NotReady(self.metrics)
        self._scheduling: scheduling_thread.SchedulingThread[operator.Operator] | None = None
        #: The serving loop's own API client (the webhook's reads and writes, login).
        self._api: ApiClient | None = None
        #: Present with a metrics port: ``/metrics``, ``/healthz``, ``/readyz``.
        self.server: serving.HttpServer | None = None

    @property
    def running(self) -> operator.Operator:
        """The operator, once start-up assembled it."""
        scheduling = self._scheduling
        if scheduling is None or scheduling.running is None:
            raise RuntimeError("the operator has not started")
        return scheduling.running

    @property
    def scheduling_loop(self) -> asyncio.AbstractEventLoop | None:
        """The loop the operator decides on (None before start-up; tests, diagnostics)."""
        return None if self._scheduling is None else self._scheduling.loop

    @property
    def synced(self) -> bool:
        """True once the operator holds a full picture and may decide."""
        return self._started() and self.running.synced

    async def on_startup(self, settings: kopf.OperatorSettings, **_: Any) -> None:
        configure_kopf(settings, self.options)
        options = self.options
        scheduling = scheduling_thread.SchedulingThread(
            lambda: operator.Operator.assemble(
                options, identity=self.identity, priority=self.priority, metrics=self.metrics
            ),
            stuck_after_s=options.scheduling_stuck_after_s,
        )
        self._scheduling = scheduling
        running = await scheduling.start()
        self._api = await client.create_api_client(options.kubeconfig)
        self._phase = answers.PodAdmission(
            lambda: running.state.admission_view, self._api, self.metrics
        )

    async def serve_http(self) -> None:
        """Start ``/metrics``, ``/healthz``, ``/readyz`` on this loop, before Kopf starts:
        a port that cannot be bound stops the process at once with one sentence
        (``ServingError``), instead of a start-up retried forever."""
        options = self.options
        if options.metrics_port is None or self.server is not None:
            return
        server = serving.HttpServer(
            self.metrics, ready=self._started, leader=self._leader, live=self._live
        )
        try:
            await server.start(options.metrics_addr, options.metrics_port)
        except OSError as exc:
            log.error(
                "metrics_port_unavailable",
                addr=options.metrics_addr,
                port=options.metrics_port,
                error=str(exc),
            )
            raise ServingError(
                f"cannot serve /metrics, /healthz and /readyz on "
                f"{options.metrics_addr}:{options.metrics_port} ({exc}): another process "
                "(another operator?) holds the port; stop it or give --metrics-port another"
            ) from None
        self.server = server

    async def stop_http(self) -> None:
        if self.server is not None:
            await self.server.stop()
            self.server = None

    def _started(self) -> bool:
        scheduling = self._scheduling
        running = None if scheduling is None else scheduling.running
        return running is not None and running.started.is_set()

    def _leader(self) -> bool:
        return self._started() and self.running.is_leader()

    def _live(self) -> str | None:
        scheduling = self._scheduling
        return None if scheduling is None else scheduling.liveness()

    async def on_cleanup(self, **_: Any) -> None:
        self._phase = answers.NotReady(self.metrics)
        scheduling, self._scheduling = self._scheduling, None
        if scheduling is not None:
            await scheduling.stop()
        if self._api is not None:
            await self._api.close()
            self._api = None

    async def on_login(self, **_: Any) -> kopf.ConnectionInfo:
        # Login runs after start-up (Kopf's order): the serving loop's client is the source.
        if self._api is None:
            raise kopf.TemporaryError("the operator has not started", delay=1)
        return await connection_info(self._api, self.options.namespace)

    async def on_pod_admission(
        self,
        body: kopf.Body,
        patch: kopf.Patch,
        warnings: list[str],
        dryrun: bool = False,
        **_: Any,
    ) -> None:
        # A dry run (kubectl --dry-run=server) writes nothing: the webhook is registered
        # with sideEffects NoneOnDryRun.
        answer = await self._phase.admit_pod(_raw(body), dry_run=dryrun)
        if not answer.allowed:
            raise kopf.AdmissionError(answer.message, code=403)
        mutated = answer.pod
        if mutated is not None:
            patch.fns.append(
                lambda raw: admission.apply_mutation(cast(dict[str, Any], raw), mutated)
            )
        warnings.extend(answer.warnings)


def _raw(body: Any) -> Pod:
    """The plain dict behind a Kopf body view (the AdmissionReview's pod)."""
    return cast(Pod, {key: body[key] for key in body})


class _DenialsAreNotErrors(logging.Filter):
    """Drops Kopf's error line for a webhook denial (``kopf.AdmissionError``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(
            message.startswith(f"{kind} {WEBHOOK_ID!r} failed permanently")
            for kind in ("Webhook", "Handler")
        )


def configure_kopf(settings: kopf.OperatorSettings, options: OperatorOptions) -> None:
    """Kopf settings for a scheduler (each with the reason)."""
    # Our own Events carry the scheduling news; Kopf's would add an Event per log line.
    settings.posting.enabled = False
    # A handler per watch event at INFO would drown the log at thousands of pods.
    objects_log = logging.getLogger("kopf.objects")
    objects_log.setLevel(logging.WARNING)
    # A webhook denial is an answer, logged by us at info; Kopf logs it as a handler error.
    if not any(isinstance(f, _DenialsAreNotErrors) for f in objects_log.filters):
        objects_log.addFilter(_DenialsAreNotErrors())
    # Reconnect quickly after an API server restart; pending pods must not wait long.
    settings.watching.reconnect_backoff = 0.5
    settings.watching.connect_timeout = 30
    settings.watching.server_timeout = 300
    # Handlers only hand objects to the feed: nothing to retry, never throttle the stream.
    settings.queueing.error_delays = (1, 5, 10)
    settings.peering.stealth = True
    webhook = options.webhook
    if webhook is not None:
        certfile, pkeyfile = webhook.certfile, webhook.pkeyfile
        if webhook.tls_secret is not None:
            target = tls_target(options)
            certfile, pkeyfile = target.certfile, target.keyfile
        settings.admission.server = kopf.WebhookServer(
            addr=webhook.addr,
            port=webhook.port,
            host=webhook.host,
            certfile=str(certfile) if certfile else None,
            pkeyfile=str(pkeyfile) if pkeyfile else None,
            cafile=str(webhook.cafile) if webhook.cafile else None,
            # Renewed certificates (cert-manager's Secret, or our own) are picked up soon.
            file_check_interval=_CERT_FILE_CHECK_S,
        )
        if webhook.managed_name:
            settings.admission.managed = webhook.managed_name


async def connection_info(api: ApiClient, namespace: str) -> kopf.ConnectionInfo:
    """Kopf's credentials, taken from our client's configuration (one source of truth)."""
    config = api.configuration
    maybe_header: Any = config.get_api_key_with_prefix("BearerToken")
    header = await maybe_header if asyncio.iscoroutine(maybe_header) else maybe_header
    scheme: str | None = None
    token: str | None = None
    if header:
        parts = str(header).split(" ", 1)
        scheme, token = (parts[0], parts[1]) if len(parts) == 2 else (None, parts[0])
    return kopf.ConnectionInfo(
        server=str(config.host),
        ca_path=config.ssl_ca_cert,
        insecure=not config.verify_ssl,
        scheme=scheme,
        token=token,
        certificate_path=config.cert_file,
        private_key_path=config.key_file,
        default_namespace=namespace,
    )


WEBHOOK_ID = "mutate-pods"


def build_registry(app: OperatorApp) -> kopf.OperatorRegistry:
    """A Kopf registry whose handlers all go to ``app``."""
    registry = kopf.OperatorRegistry()
    kopf.on.startup(registry=registry, id="startup")(app.on_startup)
    kopf.on.cleanup(registry=registry, id="cleanup")(app.on_cleanup)
    kopf.on.login(registry=registry, id="login")(app.on_login)
    if app.options.webhook is not None:
        kopf.on.mutate(
            "v1",
            "pods",
            operations=["CREATE"],
            registry=registry,
            id=WEBHOOK_ID,
            ignore_failures=True,
            # It makes ResourceClaimTemplates (DRA namespaces), never in a dry run:
            # sideEffects NoneOnDryRun where Kopf registers the webhook itself.
            side_effects=True,
        )(app.on_pod_admission)
    return registry


async def run(
    app: OperatorApp,
    *,
    stop_flag: Any = None,
    ready_flag: Any = None,
) -> None:
    """Run Kopf with the app's registry until ``stop_flag`` is raised (or a signal)."""
    options = app.options
    await prepare_webhook_tls(options)
    await app.serve_http()
    try:
        with contextlib.suppress(asyncio.CancelledError):
            await _kopf_operator(app, stop_flag=stop_flag, ready_flag=ready_flag)
    finally:
        await app.stop_http()


async def _kopf_operator(app: OperatorApp, *, stop_flag: Any, ready_flag: Any) -> None:
    options = app.options
    await kopf.operator(
        registry=build_registry(app),
        settings=kopf.OperatorSettings(),
        clusterwide=True,
        standalone=options.standalone,
        peering_name=None if options.standalone else options.peering,
        priority=app.priority,
        identity=cast(Any, app.identity),
        stop_flag=stop_flag,
        ready_flag=ready_flag,
    )
