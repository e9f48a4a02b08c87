"""CEL selector verdicts computed off the event loop.

The scheduling loop (``scheduling_thread``) decides every pod one at a time, so a
selector's evaluation must not run long on it: one tenant's selector would delay every
other tenant's decisions (the webhook and the probes are served apart). The engine's
``SelectorCache`` is set ``deferring``: a decision evaluates on the loop only a selector
of the shapes this project writes (``scheduling/cel/claim_cel_shapes.py``: short conditions
over the device's attributes and literals, whose work their text bounds), under a small
step bound (``claim_cel.INLINE_STEPS``); any other missing verdict makes the pod wait
("selector evaluation pending") and is queued. After each
decision the worker calls ``decided``: the queued pairs go, one at a time, to a child
process (``cel_process``) that evaluates each under the step bound
(``claim_cel.MAX_STEPS``) and a wall deadline; past the deadline the process is killed
(and started again for the next pair) and the pair's verdict is a refusal that says
what to change. When the queue is empty the waiting pods are woken and decided again
with the verdicts in the cache.

A deadline is measured in wall time, which a busy machine stretches: a child killed at
its deadline having used less than half of it in CPU was starved, not working, so its
pair is not refused but evaluated again a little later (``RETRY_S``), at most
``STARVED_RETRIES`` times per expression; a refusal is cached until the device changes,
so it must come from the expression, never from the machine's load.

Tenants share the one child, so the queue is kept per namespace (the namespace of the pod
whose decision met the pairs) and drained a pair at a time round the namespaces: a tenant
who makes many costly selectors delays another tenant's by at most one evaluation per
turn, and that tenant's pods are woken as soon as its own queue is empty. A namespace has
at most ``MAX_QUEUED_EXPRESSIONS`` selectors queued; the pairs of any more are handed back
unevaluated and asked again when its pods are decided again, so the queue's length is
bounded by the namespaces, not by what a tenant writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any, Final

import structlog

from vgpu_operator.control import cel_process
from vgpu_operator.scheduling.cel import claim_cel
from vgpu_operator.scheduling.pod_key import PodKey

log = structlog.get_logger("vgpu_operator.cel_offload")

#: Wall time one verdict may take in the child (the step bound is about half a second).
DEADLINE_S: Final = 2.0
#: Wall time the child may take to start (importing the interpreter).
START_S: Final = 60.0
#: A deadline hit with less than this share of it spent in the child's CPU is starvation.
STARVED_SHARE: Final = 0.5
#: How often an expression may be starved before its deadline is taken as its own.
STARVED_RETRIES: Final = 2
#: How long pods whose verdicts were starved wait before they are decided again.
RETRY_S: Final = 5.0
#: Expressions whose starved attempts are remembered (a tenant may make many).
_STARVED_MEMORY: Final = 1024
#: Selectors one namespace may have queued at once (each costs up to one step bound).
MAX_QUEUED_EXPRESSIONS: Final = 32

_Pair = tuple[str, Any, "claim_cel.DeviceView"]


class _NamespaceQueue:
    """One namespace's pairs waiting for the child, and its pods waiting for them."""

    __slots__ = ("expressions", "pairs", "waiting")

    def __init__(self) -> None:
        self.pairs: deque[_Pair] = deque()
        self.expressions: set[str] = set()
        self.waiting: set[PodKey] = set()


def process_cpu_s(pid: int) -> float | None:
    """A process's CPU seconds so far (user and system), or None where /proc cannot say."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


class OffLoopSelectors:
    def __init__(
        self,
        cache: claim_cel.SelectorCache,
        wake: Callable[[PodKey], None],
        *,
        deadline_s: float = DEADLINE_S,
        command: tuple[str, ...] = (sys.executable, "-m", "vgpu_operator.control.cel_process"),
    ) -> None:
        self._cache = cache
        cache.deferring = True
        self._wake = wake
        #: Wall time one verdict may take (``DEADLINE_S``).
        self.deadline_s = deadline_s
        self._command = command
        #: Per namespace, in the order they are served (round-robin).
        self._queues: OrderedDict[str, _NamespaceQueue] = OrderedDict()
        self._task: asyncio.Task[None] | None = None
        self._process: asyncio.subprocess.Process | None = None
        #: Per expression, how often its evaluation was starved at the deadline.
        self._starved: dict[str, int] = {}
        self._retry: asyncio.TimerHandle | None = None
        #: This drain's starved expressions and pods woken (for its log line).
        self._starved_now: set[str] = set()
        self._woken = 0
        #: Pods that queued no pairs of their own: woken when the drain ends.
        self._after_drain: set[PodKey] = set()
        #: Verdicts computed, deadlines hit (starved ones among them), and the CPU
        #: seconds children spent evaluating.
        self.evaluated = 0
        self.timeouts = 0
        self.starved = 0
        self.cpu_s = 0.0
        self._child_cpu_s = 0.0

    def decided(self, key: PodKey) -> None:
        """After a decision: if it met a pending verdict, the pod waits for the queue."""
        if not self._cache.pending_seen():
            return
        namespace = key.partition("/")[0]
        queue = self._queues.get(namespace)
        if queue is None:
            queue = self._queues[namespace] = _NamespaceQueue()
        for expression, device_key, device in self._cache.take_pending():
            if expression not in queue.expressions:
                if len(queue.expressions) >= MAX_QUEUED_EXPRESSIONS:
                    # Asked again when the pod is decided after its queue has emptied.
                    self._cache.release(expression, device_key)
                    continue
                queue.expressions.add(expression)
            queue.pairs.append((expression, device_key, device))
        if queue.pairs:
            queue.waiting.add(key)
        else:
            # Its pairs are all in flight for other pods (or handed back): woken when the
            # drain ends, not at once, which would only meet them pending again.
            if not queue.waiting:
                del self._queues[namespace]
            self._after_drain.add(key)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._drain(), name="cel")

    @property
    def child_pid(self) -> int | None:
        """The evaluator process's id while it runs (diagnostics, tests)."""
        process = self._process
        return None if process is None or process.returncode is not None else process.pid

    def busy(self) -> bool:
        """Whether pairs are being evaluated (a drain of the queues is running)."""
        return self._task is not None and not self._task.done()

    def queued(self, namespace: str) -> int:
        """Pairs one namespace has waiting for the child."""
        queue = self._queues.get(namespace)
        return 0 if queue is None else len(queue.pairs)

    def _next_pair(self) -> tuple[str, _Pair] | None:
        """The next pair round the namespaces; a namespace whose queue is empty leaves
        the rotation and its pods are woken."""
        while self._queues:
            namespace, queue = next(iter(self._queues.items()))
            if queue.pairs:
                self._queues.move_to_end(namespace)
                return namespace, queue.pairs.popleft()
            del self._queues[namespace]
            self._finish(queue)
        return None

    def _finish(self, queue: _NamespaceQueue) -> None:
        if queue.expressions & self._starved_now:
            # Decided again later: at once, they would meet the same busy machine.
            waiting = set(queue.waiting)
            self._retry = asyncio.get_running_loop().call_later(RETRY_S, self._wake_all, waiting)
        else:
            self._wake_all(queue.waiting)
        self._woken += len(queue.waiting)

    async def _drain(self) -> None:
        started = time.perf_counter()
        count = 0
        self._woken = 0
        #: Expressions past a bound on one device: their other devices get the same
        #: verdict unevaluated (any device's error refuses the claim; one bound's worth of
        #: work per expression is what a tenant may cost us).
        too_costly: dict[str, claim_cel.CelTooCostly] = {}
        self._starved_now = set()
        while (item := self._next_pair()) is not None:
            _namespace, (expression, device_key, device) = item
            known = too_costly.get(expression)
            verdict: claim_cel.Verdict | None
            if known is not None:
                verdict = known
            elif expression in self._starved_now:
                verdict = None  # its other devices wait with it
            else:
                verdict = await self._evaluate(expression, device)
                count += 1
                if isinstance(verdict, claim_cel.CelTooCostly):
                    too_costly[expression] = verdict
                if verdict is None:
                    self._starved_now.add(expression)
            if verdict is None:
                self._cache.release(expression, device_key)
            else:
                self._cache.record(expression, device_key, verdict)
        self.evaluated += count
        after, self._after_drain = self._after_drain, set()
        self._wake_all(after)
        self._woken += len(after)
        log.info(
            "cel_verdicts",
            verdicts=count,
            woken=self._woken,
            starved=len(self._starved_now),
            seconds=round(time.perf_counter() - started, 3),
            evaluator_cpu_s=round(self.cpu_s, 3),
        )

    def _wake_all(self, keys: set[PodKey]) -> None:
        for key in keys:
            self._wake(key)

    async def _evaluate(
        self, expression: str, device: claim_cel.DeviceView
    ) -> claim_cel.Verdict | None:
        """The pair's verdict, or None where the child was starved at its deadline."""
        request = {"expression": expression, "device": cel_process.device_to_wire(device)}
        try:
            process = await self._child()
            assert process.stdin is not None
            assert process.stdout is not None
            process.stdin.write((json.dumps(request) + "\n").encode())
            await process.stdin.drain()
            line = await asyncio.wait_for(process.stdout.readline(), self.deadline_s)
        except TimeoutError:
            self.timeouts += 1
            if self._was_starved(expression):
                self.starved += 1
                await self._stop_child()
                return None
            self._starved.pop(expression, None)
            await self._stop_child()
            return claim_cel.CelTooCostly(
                f"{claim_cel.shown(expression)} took longer than {self.deadline_s:g} s to "
                "evaluate on one device; make the selector cheaper (smaller list literals, "
                "fewer nested all/exists/map/filter)"
            )
        except (OSError, ConnectionError) as exc:
            await self._stop_child()
            return claim_cel.CelTooCostly(
                f"{claim_cel.shown(expression)} could not be evaluated: {exc}"
            )
        if not line:  # the child died (its memory cap): the expression built too much
            await self._stop_child()
            return claim_cel.CelTooCostly(
                f"{claim_cel.shown(expression)} used more memory than its evaluation may; make the "
                "selector build smaller values"
            )
        self._starved.pop(expression, None)
        reply = json.loads(line)
        cpu_s = float(reply.get("cpu_s", 0.0))
        self.cpu_s += max(0.0, cpu_s - self._child_cpu_s)
        self._child_cpu_s = cpu_s
        if "match" in reply:
            return bool(reply["match"])
        if reply.get("costly"):
            return claim_cel.CelTooCostly(str(reply.get("error")))
        return claim_cel.CelRuntimeError(str(reply.get("error")))

    def _was_starved(self, expression: str) -> bool:
        """Whether the child, killed at the deadline, had spent less than its share of it
        working (and the expression has not been starved too often already)."""
        process = self._process
        used = None if process is None else process_cpu_s(process.pid)
        if used is None or used - self._child_cpu_s >= STARVED_SHARE * self.deadline_s:
            return False
        tries = self._starved.get(expression, 0)
        if tries >= STARVED_RETRIES:
            return False
        if len(self._starved) >= _STARVED_MEMORY:
            self._starved.clear()
        self._starved[expression] = tries + 1
        return True

    async def _child(self) -> asyncio.subprocess.Process:
        if self._process is None or self._process.returncode is not None:
            process = await asyncio.create_subprocess_exec(
                *self._command,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
            )
            self._process = process
            self._child_cpu_s = 0.0
            assert process.stdout is not None
            try:
                ready = await asyncio.wait_for(process.stdout.readline(), START_S)
            except TimeoutError:
                ready = b""
            if not ready:
                await self._stop_child()
                raise OSError("the CEL evaluator process did not start")
            with contextlib.suppress(ValueError, TypeError, AttributeError):
                self._child_cpu_s = float(json.loads(ready).get("cpu_s", 0.0))
        return self._process

    async def _stop_child(self) -> None:
        process, self._process = self._process, None
        if process is None or process.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()

    async def close(self) -> None:
        if self._retry is not None:
            self._retry.cancel()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._stop_child()
