"""torch_neuronx's logger, configured by TORCH_NEURONX_LOG_LEVEL.

Everything the package logs goes to the ``torch_neuronx`` logger (children:
``torch_neuronx.compiler``, ``torch_neuronx.distributed``, ...). Unset, the
package adds no handler and the standard ``logging`` configuration of the
application decides, as for any library. Set to a level name (DEBUG, INFO,
WARNING, ERROR, CRITICAL; case-insensitive) the logger gets that level and a
stderr handler of its own, so ``TORCH_NEURONX_LOG_LEVEL=INFO python train.py``
shows compiles, cache hits and core binding without touching the script.
"""

from __future__ import annotations

import logging
import warnings

from torch_neuronx import config

ROOT = "torch_neuronx"
_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def get_logger(name: str = "") -> logging.Logger:
    return logging.getLogger(f"{ROOT}.{name}" if name else ROOT)


def configure(value: str | None = None) -> None:
    """Applies TORCH_NEURONX_LOG_LEVEL (or ``value``) to the package logger."""
    value = (config.log_level() or "") if value is None else value.strip().upper()
    logger = get_logger()
    if not value:
        return
    if value not in _LEVELS:
        warnings.warn(
            f"TORCH_NEURONX_LOG_LEVEL={value!r} is not a log level; expected one of "
            f"{', '.join(_LEVELS)}. Logging is left unconfigured."
        )
        return
    logger.setLevel(value)
    if not any(getattr(h, "_torch_neuronx", False) for h in logger.handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("[%(name)s %(levelname)s] %(message)s"))
        handler._torch_neuronx = True
        logger.addHandler(handler)
        logger.propagate = False
