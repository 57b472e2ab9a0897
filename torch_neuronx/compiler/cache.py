"""The on-disk cache of compiled graphs (TORCH_NEURONX_NEFF_CACHE_DIR).

An entry is one serialized XLA executable, keyed by everything that decides
what it computes: the graph's code and constants, the input signature, the
fp64 rule, and the versions of the lowering table, JAX/XLA and the host CPU
(see graph_key). Looking an entry up needs no tracing or lowering, so a warm
start skips both; only Dynamo and AOTAutograd still run.

Each entry is written to a temporary file and renamed into place (safe with
several processes writing at once) and carries a SHA-256 of its payload, so a
corrupted or truncated entry is detected, reported, deleted and recompiled
instead of being deserialized.
"""

from __future__ import annotations

import functools
import hashlib
import io
import os
import pathlib
import pickle
import tempfile
import warnings

import torch

from torch_neuronx.compiler import metrics

_MAGIC = b"TNXNEFF2"
_SUFFIX = ".neff"
_HEADER = len(_MAGIC) + 32


def cache_dir() -> str | None:
    """The cache directory in force, or None when the disk cache is disabled."""
    if os.environ.get("TORCH_NEURONX_NEFF_DISABLE_CACHE", "0").strip() in ("1", "true", "True"):
        return None
    configured = os.environ.get("TORCH_NEURONX_NEFF_CACHE_DIR", "").strip()
    if configured:
        return configured
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "torch_neuronx", "neff")


@functools.lru_cache(maxsize=1)
def _toolchain_fingerprint() -> str:
    """What else an entry depends on: the code that compiles and lowers graphs
    (this package's compiler and lowering table), JAX/XLA, XLA_FLAGS and the
    host CPU the code was generated for."""
    import jax
    import jaxlib

    import torch_neuronx

    digest = hashlib.sha256()
    package = pathlib.Path(torch_neuronx.__file__).parent
    for path in sorted((package / "lowering").glob("*.py")) + sorted((package / "compiler").glob("*.py")):
        digest.update(path.read_bytes())
    digest.update(f"{jax.__version__}|{jaxlib.__version__}|{os.environ.get('XLA_FLAGS', '')}".encode())
    digest.update(_cpu_flags().encode())
    return digest.hexdigest()


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as handle:
            return next((line for line in handle if line.startswith("flags")), "")
    except OSError:
        import platform

        return platform.processor()


def graph_key(parts: list[bytes]) -> str:
    """The entry name for a graph, from the byte strings that identify it."""
    digest = hashlib.sha256(_toolchain_fingerprint().encode())
    for part in parts:
        digest.update(len(part).to_bytes(8, "little"))
        digest.update(part)
    return digest.hexdigest()


def update_with_tensor(digest, name: str, tensor) -> None:
    """Adds a graph's tensor constant to a key: its name, dtype, shape and bytes
    (graph code names constants but does not show their values)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily():  # AOTAutograd and Dynamo call backends under their fake mode
        flat = tensor.detach().cpu().contiguous().reshape(-1)
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}".encode())
        digest.update(flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b"")


def _path(key: str, suffix: str) -> pathlib.Path | None:
    folder = cache_dir()
    return None if folder is None else pathlib.Path(folder) / (key + suffix)


def _discard(path: pathlib.Path, why: str) -> None:
    metrics.record_cache_hit("corrupt")
    warnings.warn(
        f"torch_neuronx: compiled-graph cache entry {path} {why}; it was removed and the graph is "
        "recompiled."
    )
    path.unlink(missing_ok=True)


def discard(key: str, suffix: str, why: str) -> None:
    """Removes an entry whose payload passed the checksum but could not be used
    (written by another build), with a warning."""
    path = _path(key, suffix)
    if path is not None:
        _discard(path, why)


def _read(path: pathlib.Path) -> bytes | None:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    payload = data[_HEADER:]
    if data[: len(_MAGIC)] != _MAGIC or hashlib.sha256(payload).digest() != data[len(_MAGIC):_HEADER]:
        _discard(path, "is corrupted or truncated")
        return None
    return payload


def _write(path: pathlib.Path, payload: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=path.suffix)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(_MAGIC + hashlib.sha256(payload).digest() + payload)
        os.replace(temp, path)
    except BaseException:
        pathlib.Path(temp).unlink(missing_ok=True)
        raise


def load_bytes(key: str, suffix: str) -> bytes | None:
    """The checked payload stored under key, or None (a miss, the cache off, or
    a corrupted entry, which is reported and removed)."""
    path = _path(key, suffix)
    return None if path is None else _read(path)


def store_bytes(key: str, suffix: str, payload: bytes) -> None:
    """Stores payload under key (nothing when the disk cache is off)."""
    path = _path(key, suffix)
    if path is not None:
        _write(path, payload)


def load(key: str):
    """The executable stored under key (a jax.stages.Compiled), or None."""
    payload = load_bytes(key, _SUFFIX)
    if payload is None:
        return None
    from jax.experimental.serialize_executable import deserialize_and_load

    try:
        serialized, in_tree, out_tree = pickle.loads(payload)
        executable = deserialize_and_load(serialized, in_tree, out_tree, backend="cpu")
    except Exception as error:  # written by an incompatible build: same as a bad entry
        discard(key, _SUFFIX, f"could not be loaded ({type(error).__name__}: {error})")
        return None
    metrics.record_cache_hit("disk")
    return executable


def store(key: str, executable) -> None:
    """Writes the executable under key (nothing when the disk cache is off or
    the executable cannot be serialized)."""
    if cache_dir() is None:
        return
    from jax.experimental.serialize_executable import serialize

    try:
        serialized, in_tree, out_tree = serialize(executable)
    except (ValueError, NotImplementedError):
        return
    with io.BytesIO() as buffer:
        pickle.dump((serialized, in_tree, out_tree), buffer, protocol=pickle.HIGHEST_PROTOCOL)
        store_bytes(key, _SUFFIX, buffer.getvalue())
