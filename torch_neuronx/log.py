"""torch_neuronx's logger, configured by TORCH_NEURONX_LOG_LEVEL and TORCH_NEURONX_LOG_FILE.

Everything the package logs goes to the ``torch_neuronx`` logger (children:
``torch_neuronx.compiler``, ``torch_neuronx.distributed``, ...). Unset, the
package adds no handler and the standard ``logging`` configuration of the
application decides, as for any library. Set to a level name (DEBUG, INFO,
WARNING, ERROR, CRITICAL; case-insensitive) or to one of AWS TorchNeuron's
numeric levels (0 ERROR, 1 WARNING, 2 INFO, 3 DEBUG) the logger gets that level
and a handler of its own, so ``TORCH_NEURONX_LOG_LEVEL=INFO python train.py``
shows compiles, cache hits and core binding without touching the script.

The handler writes to stderr, or, with TORCH_NEURONX_LOG_FILE, appends to that
file instead (as TorchNeuron does: the file is opened in append mode and
replaces the console). A log file without a level logs at WARNING, TorchNeuron's
default level.
"""

from __future__ import annotations

import logging
import warnings

from torch_neuronx import config

ROOT = "torch_neuronx"
_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
# AWS TorchNeuron's numeric TORCH_NEURONX_LOG_LEVEL (its LogLevel enum: ERROR=0 ... DEBUG=3).
NUMERIC_LEVELS = {"0": "ERROR", "1": "WARNING", "2": "INFO", "3": "DEBUG"}
_DEFAULT_FILE_LEVEL = "WARNING"


def get_logger(name: str = "") -> logging.Logger:
    return logging.getLogger(f"{ROOT}.{name}" if name else ROOT)


def level_name(value: str) -> str | None:
    """The logging level name of a TORCH_NEURONX_LOG_LEVEL value, None when it is not one."""
    value = value.strip().upper()
    value = NUMERIC_LEVELS.get(value, value)
    return value if value in _LEVELS else None


def _handler(path: str | None) -> logging.Handler:
    if path:
        try:
            return logging.FileHandler(path, mode="a", encoding="utf-8")
        except OSError as error:
            warnings.warn(f"TORCH_NEURONX_LOG_FILE={path!r} cannot be opened ({error}); "
                          "logging to stderr instead.")
    return logging.StreamHandler()


def configure(value: str | None = None) -> None:
    """Applies TORCH_NEURONX_LOG_LEVEL (or ``value``) and TORCH_NEURONX_LOG_FILE to the package logger."""
    value = (config.log_level() or "") if value is None else value.strip().upper()
    path = config.log_file()
    logger = get_logger()
    if not value and not path:
        return
    level = level_name(value) if value else _DEFAULT_FILE_LEVEL
    if level is None:
        choices = ", ".join(_LEVELS) + " or " + ", ".join(f"{k} ({v})" for k, v in NUMERIC_LEVELS.items())
        warnings.warn(
            f"TORCH_NEURONX_LOG_LEVEL={value!r} is not a log level; expected one of {choices}. "
            "Logging is left unconfigured."
        )
        return
    logger.setLevel(level)
    if not any(getattr(h, "_torch_neuronx", False) for h in logger.handlers):
        handler = _handler(path)
        handler.setFormatter(logging.Formatter("[%(name)s %(levelname)s] %(message)s"))
        handler._torch_neuronx = True
        logger.addHandler(handler)
        logger.propagate = False
