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
#: The most characters all the values of one line carry together.
MAX_LINE_CHARS = 6000
#: What another field is cut to first when a line is over ``MAX_LINE_CHARS``.
OTHER_FIELD_CHARS = 200
#: The fields that say what happened and why. A refusal's line must keep its reason:
#: these are cut last, and only in the middle (a refusal quotes the value first and
#: gives the reason after it, so cutting the end lost exactly the reason).
REASON_FIELDS = frozenset({"event", "reason", "error", "problem", "message", "why"})
_CUT_NOTE_CHARS = 40


def cut_middle(text: str, limit: int) -> str:
    """``text`` within about ``limit`` characters: its start and its end, saying how many
    characters were cut between them."""
    if len(text) <= limit:
        return text
    head = max(limit // 2, 1)
    tail = max(limit - head, 0)
    cut = len(text) - head - tail
    return f"{text[:head]}… ({cut} more characters) …{text[len(text) - tail :]}"


def bound_values(
    logger: object, method: str, event: structlog.typing.EventDict
) -> structlog.typing.EventDict:
    """Bound one line: every value to ``MAX_VALUE_CHARS`` (lists and mappings as their
    text), then the line to ``MAX_LINE_CHARS``, cutting other fields before the reason
    fields. Cuts are made in the middle, so a value's end (a refusal's reason) stays."""
    sizes: dict[str, int] = {}
    for key, value in event.items():
        if isinstance(value, list | tuple | dict | set | frozenset):
            text = str(value)
            if len(text) <= MAX_VALUE_CHARS:
                sizes[key] = len(text)
                continue
            value = text
        if isinstance(value, str):
            if len(value) > MAX_VALUE_CHARS:
                value = event[key] = cut_middle(value, MAX_VALUE_CHARS)
            sizes[key] = len(value)
    excess = sum(sizes.values()) - MAX_LINE_CHARS
    if excess <= 0:
        return event
    others = sorted((k for k in sizes if k not in REASON_FIELDS), key=lambda k: -sizes[k])
    reasons = sorted((k for k in sizes if k in REASON_FIELDS), key=lambda k: -sizes[k])
    for key in [*others, *reasons]:
        if excess <= 0:
            break
        floor = OTHER_FIELD_CHARS if key in others else MAX_LINE_CHARS // (2 * len(reasons))
        # The note a cut leaves ("… (N more characters) …") takes room too.
        target = max(sizes[key] - excess - _CUT_NOTE_CHARS, floor)
        if target < sizes[key] - _CUT_NOTE_CHARS:
            text = cut_middle(str(event[key]), target)
            excess -= sizes[key] - len(text)
            event[key] = text
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
