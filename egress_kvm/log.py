"""JSON logging with controller-runtime's (zap + logr) level semantics.

logr's V(n) maps onto zap level -n: V(0) is info, V(1) is `--zap-log-level=debug`, V(2) needs
`--zap-log-level=2`. We map V(n) onto Python logging level INFO - n, so the stdlib filter does the
gating and any handler works. Lines carry zap's keys (`ts`, `level`, `logger`, `msg`) plus fields.

Other libraries' loggers (asyncio's "Task exception was never retrieved", asyncssh, aiohttp,
kubernetes_asyncio) go through the same JSON formatter on the root logger, at WARNING and above: a
plain-text line among JSON ones breaks every log pipeline that parses them.

Loggers are immutable and cheap: `log.with_values(host="nas1")` returns a new one, so a provider can
hand a pre-labelled logger to every operation without threading fields through calls.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Mapping
from typing import Any, TextIO

_ROOT = "egress"
INFO = logging.INFO


def level_for_v(v: int) -> int:
    return INFO - v


def parse_zap_level(value: str) -> int:
    """`--zap-log-level`: debug, info, error, or an integer verbosity N (>0 means V(N))."""
    v = value.strip().lower()
    named = {"debug": level_for_v(1), "info": INFO, "error": logging.ERROR, "warn": logging.WARNING,
             "warning": logging.WARNING, "panic": logging.CRITICAL, "dpanic": logging.CRITICAL,
             "fatal": logging.CRITICAL}
    if v in named:
        return named[v]
    try:
        n = int(v)
    except ValueError:
        raise ValueError(f"--zap-log-level: {value!r} is not debug, info, error or an integer") from None
    if n < 0:
        raise ValueError(f"--zap-log-level: {value!r} must not be negative")
    return level_for_v(n)


def _zap_level_name(levelno: int) -> str:
    if levelno >= logging.ERROR:
        return "error"
    if levelno >= logging.WARNING:
        return "warn"
    if levelno >= INFO:
        return "info"
    v = INFO - levelno
    return "debug" if v == 1 else f"Level({-v})"


def _jsonable(value: Any) -> Any:
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    if isinstance(value, bytes):
        return f"<{len(value)} bytes>"  # never dump raw payloads (they may be cloud-init)
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_jsonable(v) for v in value]
    return str(value)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": round(record.created, 6),
            "level": _zap_level_name(record.levelno),
            "logger": record.name.removeprefix(_ROOT).lstrip(".") or "root",
            "msg": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if fields:
            for k, v in fields.items():
                line.setdefault(k, _jsonable(v))
        if record.exc_info and record.exc_info[1] is not None:
            if "error" not in line:
                line["error"] = str(record.exc_info[1])
            line.setdefault("stacktrace", self.formatException(record.exc_info))  # as zap's errors have
        return json.dumps(line, separators=(",", ":"))


def configure(level: int | str = INFO, stream: TextIO | None = None) -> None:
    """Send every egress logger to `stream` as JSON lines at `level` (an int or a zap level string), and
    every other library's records at WARNING and above (or `level`, if stricter) the same way."""
    if isinstance(level, str):
        level = parse_zap_level(level)
    ours = logging.getLogger(_ROOT)
    for h in list(ours.handlers):
        ours.removeHandler(h)
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    ours.addHandler(handler)
    ours.setLevel(level)
    ours.propagate = False
    # The root logger: only our own earlier handler is replaced (a test runner's capture handler stays).
    root = logging.getLogger()
    for h in list(root.handlers):
        if getattr(h, "_egress_json", False):
            root.removeHandler(h)
    other = logging.StreamHandler(stream or sys.stderr)
    other.setFormatter(JsonFormatter())
    other._egress_json = True  # type: ignore[attr-defined]
    other.setLevel(max(level, logging.WARNING))
    root.addHandler(other)
    if root.level == logging.NOTSET or root.level > other.level:
        root.setLevel(other.level)


class Logger:
    """A logr-style logger: named, with bound key/values and a verbosity."""

    __slots__ = ("_fields", "_logger", "_v", "name")

    def __init__(self, name: str, fields: Mapping[str, Any] | None = None, v: int = 0) -> None:
        self.name = name
        self._logger = logging.getLogger(f"{_ROOT}.{name}" if name else _ROOT)
        self._fields = dict(fields or {})
        self._v = v

    def with_name(self, suffix: str) -> Logger:
        return Logger(f"{self.name}.{suffix}" if self.name else suffix, self._fields, self._v)

    def with_values(self, **fields: Any) -> Logger:
        return Logger(self.name, {**self._fields, **fields}, self._v)

    def v(self, level: int) -> Logger:
        return Logger(self.name, self._fields, self._v + level)

    def enabled(self, v: int = 0) -> bool:
        return self._logger.isEnabledFor(level_for_v(self._v + v))

    def info(self, msg: str, **fields: Any) -> None:
        self._emit(level_for_v(self._v), msg, fields)

    def warning(self, msg: str, **fields: Any) -> None:
        self._emit(logging.WARNING, msg, fields)

    def error(self, err: BaseException | str | None, msg: str, **fields: Any) -> None:
        if err is not None:
            fields = {"error": str(err), **fields}
        self._emit(logging.ERROR, msg, fields)

    def _emit(self, levelno: int, msg: str, fields: Mapping[str, Any]) -> None:
        if self._logger.isEnabledFor(levelno):
            self._logger.log(levelno, msg, extra={"fields": {**self._fields, **fields}})


def get_logger(name: str = "", **fields: Any) -> Logger:
    return Logger(name, fields)
