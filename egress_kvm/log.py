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
import os
import sys
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import Enum
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
    if levelno >= logging.CRITICAL:
        return "panic"
    if levelno >= logging.ERROR:
        return "error"
    if levelno >= logging.WARNING:
        return "warn"
    if levelno >= INFO:
        return "info"
    v = INFO - levelno
    return "debug" if v == 1 else f"Level({-v})"


class Encoder(Enum):
    """`--zap-encoder`: one JSON object per line, or zap's tab-separated console form for humans."""

    JSON = "json"
    CONSOLE = "console"


class TimeEncoding(Enum):
    """`--zap-time-encoding`, zap's names: what the `ts` key holds."""

    EPOCH = "epoch"  # float seconds since the epoch
    MILLIS = "millis"  # float milliseconds
    NANO = "nano"  # integer nanoseconds
    ISO8601 = "iso8601"  # 2026-01-02T03:04:05.678Z
    RFC3339 = "rfc3339"  # 2026-01-02T03:04:05Z
    RFC3339NANO = "rfc3339nano"  # 2026-01-02T03:04:05.678901Z


# `--zap-stacktrace-level` takes these names only, as controller-runtime's flag does.
STACKTRACE_LEVELS = {"debug": level_for_v(1), "info": INFO, "warn": logging.WARNING, "error": logging.ERROR,
                     "panic": logging.CRITICAL}


def parse_stacktrace_level(value: str) -> int:
    v = value.strip().lower()
    if v not in STACKTRACE_LEVELS:
        raise ValueError(f"--zap-stacktrace-level: {value!r} is not one of {', '.join(STACKTRACE_LEVELS)}")
    return STACKTRACE_LEVELS[v]


@dataclass(frozen=True)
class ZapOptions:
    """controller-runtime's zap.Options: `development` changes the defaults (console encoder, debug level,
    stack traces from warn) and the other fields override them when set."""

    development: bool = False
    level: int | None = None
    encoder: Encoder | None = None
    stacktrace_level: int | None = None
    time_encoding: TimeEncoding | None = None

    @property
    def resolved_level(self) -> int:
        if self.level is not None:
            return self.level
        return level_for_v(1) if self.development else INFO

    @property
    def resolved_encoder(self) -> Encoder:
        return self.encoder or (Encoder.CONSOLE if self.development else Encoder.JSON)

    @property
    def resolved_stacktrace_level(self) -> int:
        if self.stacktrace_level is not None:
            return self.stacktrace_level
        return logging.WARNING if self.development else logging.ERROR

    @property
    def resolved_time_encoding(self) -> TimeEncoding:
        # JSON: epoch as before (and as controller-runtime's flag help says), so log pipelines keep working;
        # console: zap's development default, readable.
        if self.time_encoding is not None:
            return self.time_encoding
        return TimeEncoding.ISO8601 if self.resolved_encoder is Encoder.CONSOLE else TimeEncoding.EPOCH


def encode_time(created: float, encoding: TimeEncoding) -> float | int | str:
    if encoding is TimeEncoding.EPOCH:
        return round(created, 6)
    if encoding is TimeEncoding.MILLIS:
        return round(created * 1000, 3)
    if encoding is TimeEncoding.NANO:
        return int(created * 1_000_000_000)
    t = datetime.fromtimestamp(created, UTC)
    if encoding is TimeEncoding.RFC3339:
        return t.strftime("%Y-%m-%dT%H:%M:%SZ")
    if encoding is TimeEncoding.ISO8601:
        return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"
    fraction = f"{t.microsecond:06d}".rstrip("0")  # Go's RFC3339Nano drops trailing zeros
    return t.strftime("%Y-%m-%dT%H:%M:%S") + (f".{fraction}" if fraction else "") + "Z"


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


_HERE = __file__


def _caller_stack() -> str:
    """The stack that logged (zap records one at the stacktrace level even without an error), without the
    logging machinery's own frames."""
    frames = [f for f in traceback.extract_stack()
              if f.filename != _HERE and f"{os.sep}logging{os.sep}" not in f.filename]
    return "".join(traceback.format_list(frames)).rstrip("\n")


class JsonFormatter(logging.Formatter):
    def __init__(self, *, time_encoding: TimeEncoding = TimeEncoding.EPOCH,
                 stacktrace_level: int = logging.ERROR) -> None:
        super().__init__()
        self.time_encoding = time_encoding
        self.stacktrace_level = stacktrace_level

    def fields(self, record: logging.LogRecord) -> dict[str, Any]:
        """zap's keys (`ts`, `level`, `logger`, `msg`), then the record's fields, `error`, `stacktrace`."""
        line: dict[str, Any] = {
            "ts": encode_time(record.created, self.time_encoding),
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
        elif record.levelno >= self.stacktrace_level:
            line.setdefault("stacktrace", _caller_stack())
        return line

    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(self.fields(record), separators=(",", ":"))


class ConsoleFormatter(JsonFormatter):
    """zap's console encoder: `ts<TAB>LEVEL<TAB>logger<TAB>msg<TAB>{"key": "value"}`, the stack trace on
    the lines after."""

    def format(self, record: logging.LogRecord) -> str:
        line = self.fields(record)
        stack = line.pop("stacktrace", None)
        head = [str(line.pop("ts")), str(line.pop("level")).upper(), str(line.pop("logger")),
                str(line.pop("msg"))]
        text = "\t".join(head)
        if line:
            text += "\t" + json.dumps(line, separators=(", ", ": "))
        return f"{text}\n{stack}" if stack else text


def configure(level: int | str = INFO, stream: TextIO | None = None, *,
              options: ZapOptions | None = None) -> None:
    """Send every egress logger to `stream` (stderr by default) at `level` (an int or a zap level string;
    `options.level` wins when given), as JSON lines unless `options` says otherwise, and every other
    library's records at WARNING and above (or the level, if stricter) the same way."""
    if isinstance(level, str):
        level = parse_zap_level(level)
    if options is not None:
        level = options.resolved_level
    opts = options or ZapOptions(level=level)
    kind = ConsoleFormatter if opts.resolved_encoder is Encoder.CONSOLE else JsonFormatter

    def formatter() -> logging.Formatter:
        return kind(time_encoding=opts.resolved_time_encoding,
                    stacktrace_level=opts.resolved_stacktrace_level)

    ours = logging.getLogger(_ROOT)
    for h in list(ours.handlers):
        ours.removeHandler(h)
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(formatter())
    ours.addHandler(handler)
    ours.setLevel(level)
    ours.propagate = False
    # The root logger: only our own earlier handler is replaced (a test runner's capture handler stays).
    root = logging.getLogger()
    for h in list(root.handlers):
        if getattr(h, "_egress_json", False):
            root.removeHandler(h)
    other = logging.StreamHandler(stream or sys.stderr)
    other.setFormatter(formatter())
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
