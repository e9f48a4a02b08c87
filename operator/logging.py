"""Structured logs for every process: structlog, with the standard library bridged in.

Kopf, aiohttp and kubernetes_asyncio log through the standard ``logging`` module. The
bridge sends their records through the same processors and renderer as our own
structlog events, so one process writes one format: JSON lines for machines (the
default when stderr is not a terminal) or coloured key=value lines for people.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from typing import Literal, TextIO

import structlog
from structlog.typing import Processor

LogFormat = Literal["auto", "json", "console"]

#: Libraries that log every request at INFO; at the root level they would drown our events.
_CHATTY_LOGGERS = ("aiohttp.access", "kubernetes_asyncio.client.rest")

#: The longest text value a log line carries. Values come from objects anyone may write
#: (a 200 kB annotation quoted in a refusal): one line must not carry all of it.
MAX_VALUE_CHARS = 2000


def bound_values(
    logger: object, method: str, event: structlog.typing.EventDict
) -> structlog.typing.EventDict:
    """Cut every text value longer than ``MAX_VALUE_CHARS``, saying how much was cut."""
    for key, value in event.items():
        if isinstance(value, str) and len(value) > MAX_VALUE_CHARS:
            cut = len(value) - MAX_VALUE_CHARS
            event[key] = f"{value[:MAX_VALUE_CHARS]}… ({cut} more characters)"
    return event


def resolve_format(fmt: LogFormat, stream: TextIO) -> Literal["json", "console"]:
    """``auto`` becomes ``console`` on a terminal and ``json`` everywhere else."""
    if fmt != "auto":
        return fmt
    isatty = getattr(stream, "isatty", None)
    return "console" if isatty is not None and isatty() else "json"


def configure(
    fmt: LogFormat = "auto",
    level: int | str = "INFO",
    *,
    stream: TextIO | None = None,
) -> Literal["json", "console"]:
    """Set up structlog and the root logger; returns the format chosen.

    ``level`` is a name (``"DEBUG"``) or a ``logging`` number. Safe to call again (tests,
    a CLI that reconfigures after parsing options): the root handler is replaced, not
    added twice.
    """
    out = sys.stderr if stream is None else stream
    chosen = resolve_format(fmt, out)
    numeric_level = logging.getLevelName(level.upper()) if isinstance(level, str) else level
    if not isinstance(numeric_level, int):
        raise ValueError(f"unknown log level {level!r}")

    # Steps shared by our events and by records arriving from the standard library.
    shared: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: Processor
    if chosen == "json":
        shared.append(structlog.processors.format_exc_info)
        renderer = structlog.processors.JSONRenderer()
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=_wants_colour(out))

    structlog.configure(
        processors=[
            structlog.stdlib.filter_by_level,
            *shared,
            structlog.stdlib.PositionalArgumentsFormatter(),
            structlog.processors.StackInfoRenderer(),
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        # Below the level, a call returns at once, before any processor runs: the
        # per-pod debug events then cost nothing at info (filter_by_level would still
        # build each event first; it stays for loggers set quieter than the root).
        wrapper_class=structlog.make_filtering_bound_logger(numeric_level),
        cache_logger_on_first_use=False,
    )

    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            bound_values,
            renderer,
        ],
    )
    handler = logging.StreamHandler(out)
    handler.setFormatter(formatter)
    handler.set_name(_HANDLER_NAME)

    root = logging.getLogger()
    _replace_handler(root, handler)
    root.setLevel(numeric_level)
    for name in _CHATTY_LOGGERS:
        logging.getLogger(name).setLevel(max(numeric_level, logging.WARNING))
    return chosen


_HANDLER_NAME = "vgpu-operator"


def _replace_handler(root: logging.Logger, handler: logging.Handler) -> None:
    stale: Sequence[logging.Handler] = [h for h in root.handlers if h.get_name() == _HANDLER_NAME]
    for old in stale:
        root.removeHandler(old)
    root.addHandler(handler)


def _wants_colour(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    return isatty is not None and bool(isatty())
