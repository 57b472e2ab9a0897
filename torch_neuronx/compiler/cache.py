"""The on-disk cache of compiled executables (TORCH_NEURONX_NEFF_CACHE_DIR).

XLA executables are cached across processes through JAX's persistent
compilation cache, with this module's store behind it: each entry is written
to a temporary file and renamed into place (safe with several processes
writing at once), and carries a SHA-256 of its payload, so a corrupted or
truncated entry is detected, reported, deleted and recompiled instead of
being deserialized.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import tempfile
import threading
import warnings

from torch_neuronx.compiler import metrics

_MAGIC = b"TNXNEFF1"
_SUFFIX = ".neff"
_installed = threading.Lock()
_state = {"dir": None}


def cache_dir() -> str | None:
    """The cache directory in force, or None when the disk cache is disabled."""
    if os.environ.get("TORCH_NEURONX_NEFF_DISABLE_CACHE", "0").strip() in ("1", "true", "True"):
        return None
    configured = os.environ.get("TORCH_NEURONX_NEFF_CACHE_DIR", "").strip()
    if configured:
        return configured
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "torch_neuronx", "neff")


def _store_class():
    from jax._src.compilation_cache_interface import CacheInterface

    class ChecksummedStore(CacheInterface):
        def __init__(self, path: str):
            self._path = pathlib.Path(path)
            self._path.mkdir(parents=True, exist_ok=True)

        def _file(self, key: str) -> pathlib.Path:
            return self._path / (key + _SUFFIX)

        def get(self, key: str):
            path = self._file(key)
            try:
                data = path.read_bytes()
            except FileNotFoundError:
                return None
            header = len(_MAGIC) + 32
            payload = data[header:]
            if data[: len(_MAGIC)] != _MAGIC or hashlib.sha256(payload).digest() != data[len(_MAGIC):header]:
                metrics.record_cache_hit("corrupt")
                warnings.warn(
                    f"torch_neuronx: compiled-graph cache entry {path} is corrupted or truncated; "
                    "it was removed and the graph is recompiled."
                )
                path.unlink(missing_ok=True)
                return None
            metrics.record_cache_hit("disk")
            return payload

        def put(self, key: str, value: bytes):
            data = _MAGIC + hashlib.sha256(value).digest() + value
            fd, temp = tempfile.mkstemp(dir=self._path, prefix=".tmp-", suffix=_SUFFIX)
            try:
                with os.fdopen(fd, "wb") as handle:
                    handle.write(data)
                os.replace(temp, self._file(key))
            except BaseException:
                pathlib.Path(temp).unlink(missing_ok=True)
                raise

    return ChecksummedStore


def install() -> str | None:
    """Points JAX's persistent cache at the neuron store (once per process)."""
    path = cache_dir()
    with _installed:
        if _state["dir"] == path:
            return path
        import jax
        from jax._src import compilation_cache

        compilation_cache.reset_cache()
        if path is None:
            jax.config.update("jax_enable_compilation_cache", False)
        else:
            jax.config.update("jax_enable_compilation_cache", True)
            jax.config.update("jax_compilation_cache_dir", path)
            jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
            jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
            compilation_cache._cache = _store_class()(path)
            compilation_cache._cache_initialized = True
        _state["dir"] = path
        return path
