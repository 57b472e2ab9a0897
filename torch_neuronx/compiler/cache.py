"""The on-disk cache of compiled graphs (TORCH_NEURONX_NEFF_CACHE_DIR).

An entry is one serialized XLA executable, keyed by everything that decides
what it computes: the graph's code and constants, the input signature, the
fp64 rule, and a fingerprint of the toolchain: this package's version and
every source file of it, PyTorch's and JAX/XLA's versions, XLA_FLAGS and the
host CPU (see graph_key). Looking an entry up needs no tracing or lowering, so a warm
start skips both; only Dynamo and AOTAutograd still run. What lowering does
besides emitting code, the warm start does before running the entry: each
entry lists the custom-call targets its executable calls (LAPACK, ...), and
those are prepared when it is loaded (_warm_start_preparations).

Each entry is written to a temporary file and renamed into place (safe with
several processes writing at once) and carries a SHA-256 of its payload, so a
corrupted or truncated entry is detected, reported, deleted and recompiled
instead of being deserialized.

The directory is kept under TORCH_NEURONX_NEFF_CACHE_MAX_SIZE: after each
write, the least recently used entries (a hit refreshes an entry's mtime) are
deleted until the rest fit. Deleting is safe while other processes read: an
entry gone before it is opened is a miss, one already opened is read whole.
"""

from __future__ import annotations

import functools
import hashlib
import io
import os
import pathlib
import pickle
import re
import tempfile
import time
import warnings

import torch

from torch_neuronx import config
from torch_neuronx.compiler import metrics
from torch_neuronx.log import get_logger

_log = get_logger("compiler")

_MAGIC = b"TNXNEFF2"
_SUFFIX = ".neff"
_HEADER = len(_MAGIC) + 32
_ENTRY_SUFFIXES = (".neff", ".aot")
_STALE_TEMP_SECONDS = 3600  # a temporary file this old was left by a killed writer
_CUSTOM_CALL = re.compile(r'custom_call_target="([^"]+)"')
_XLA_TARGETS = ("TopK",)  # custom calls XLA:CPU implements itself (jax.lax.top_k: multinomial)


def cache_dir() -> str | None:
    """The cache directory in force, or None when the disk cache is disabled."""
    if config.neff_disable_cache():
        return None
    return config.neff_cache_dir()


def max_size() -> int | None:
    """The size limit of the cache directory in bytes (TORCH_NEURONX_NEFF_CACHE_MAX_SIZE),
    or None for no limit."""
    return config.neff_cache_max_size()


def package_sources(package: pathlib.Path) -> list[pathlib.Path]:
    """The source files an entry depends on: every Python file of the package.
    Not only lowering/ and compiler/: a compiled graph also depends on what
    they import (ops/float8.py's decompositions, the fp64 rule, the profiles
    of neuron/, ...), and a narrower list would silently miss the next such
    module. The C extension is left out: executables never call it."""
    return sorted(package.rglob("*.py"))


def source_digest(package: pathlib.Path) -> bytes:
    """A digest of the package's sources: each file's path and content."""
    digest = hashlib.sha256()
    for path in package_sources(package):
        digest.update(path.relative_to(package).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.digest()


@functools.lru_cache(maxsize=1)
def _toolchain_fingerprint() -> str:
    """What else an entry depends on: the code that compiles and lowers graphs
    (this package's version and sources, PyTorch's version), JAX/XLA, XLA_FLAGS
    and the host CPU the code was generated for. Computed once per process, at
    the first compile (5-11 ms measured for the package's ~90 files, 0.85 MB)."""
    import jax
    import jaxlib

    import torch_neuronx

    digest = hashlib.sha256(source_digest(pathlib.Path(torch_neuronx.__file__).parent))
    digest.update(f"{torch_neuronx.__version__}|{torch.__version__}|{torch.version.git_version}".encode())
    digest.update(f"{jax.__version__}|{jaxlib.__version__}|{config.xla_flags()}".encode())
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


def update_with_graph(digest, gm, check=None) -> None:
    """Adds an FX graph to a key: its code, the values of the tensor constants
    it reads (code alone names them, e.g. _tensor_constant0), and its
    subgraphs (branches and bodies of higher-order ops), recursively.
    `check(node, value)` sees every node first (value: a get_attr's attribute,
    else None) and may raise to refuse the graph."""
    import torch

    digest.update(gm.code.encode())
    for node in gm.graph.nodes:
        value = getattr(gm, node.target) if node.op == "get_attr" else None
        if check is not None:
            check(node, value)
        if isinstance(value, torch.fx.GraphModule):
            digest.update(node.target.encode())
            update_with_graph(digest, value, check)
        elif isinstance(value, torch.Tensor):
            update_with_tensor(digest, node.target, value)


def _path(key: str, suffix: str) -> pathlib.Path | None:
    folder = cache_dir()
    return None if folder is None else pathlib.Path(folder) / (key + suffix)


def _discard(path: pathlib.Path, why: str) -> None:
    metrics.record_cache_hit("corrupt")
    warnings.warn(
        f"torch_neuronx: compiled-graph cache entry {path} {why}; it was removed and the graph is "
        "recompiled."
    )
    _remove(path)


def _remove(path: pathlib.Path) -> bool:
    """Deletes path if it is there; False when it cannot be (a read-only cache)."""
    try:
        path.unlink(missing_ok=True)
        return True
    except OSError:
        return False


def discard(key: str, suffix: str, why: str) -> None:
    """Removes an entry whose payload passed the checksum but could not be used
    (written by another build), with a warning."""
    path = _path(key, suffix)
    if path is not None:
        _discard(path, why)


_warned_unusable: set[str] = set()


def _unusable(path: pathlib.Path, action: str, error: OSError) -> None:
    """Warns once per directory that the disk cache cannot be used there; the
    graph still compiles and runs, only without the disk cache."""
    folder = str(path.parent)
    if folder not in _warned_unusable:
        _warned_unusable.add(folder)
        warnings.warn(
            f"torch_neuronx: cannot {action} the compiled-graph cache in {folder} "
            f"({type(error).__name__}: {error}); compiling without it. Point "
            "TORCH_NEURONX_NEFF_CACHE_DIR at a writable directory, or set "
            "TORCH_NEURONX_NEFF_DISABLE_CACHE=1 to turn the disk cache off."
        )


def _read(path: pathlib.Path) -> bytes | None:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as error:  # not a directory, no permission, I/O error: a miss
        _unusable(path, "read", error)
        return None
    payload = data[_HEADER:]
    if data[: len(_MAGIC)] != _MAGIC or hashlib.sha256(payload).digest() != data[len(_MAGIC):_HEADER]:
        _discard(path, "is corrupted or truncated")
        return None
    try:
        os.utime(path)  # recently used: the last to be evicted
    except OSError:
        pass  # evicted by another process meanwhile; the payload read is whole
    return payload


def _entries(folder: pathlib.Path, remove_stale: bool = True) -> list[tuple[float, int, pathlib.Path]]:
    """(mtime, size, path) of each entry; stale temporary files are removed
    (unless remove_stale is False: a read-only look)."""
    found = []
    now = time.time()
    try:
        listing = list(os.scandir(folder))
    except OSError:
        return found
    for item in listing:
        try:
            info = item.stat()
        except OSError:
            continue  # removed by another process
        if item.name.startswith(".tmp-"):
            if remove_stale and now - info.st_mtime > _STALE_TEMP_SECONDS:
                _remove(pathlib.Path(item.path))
        elif item.name.endswith(_ENTRY_SUFFIXES) and item.is_file():
            found.append((info.st_mtime, info.st_size, pathlib.Path(item.path)))
    return found


def stats() -> dict:
    """What the cache in force holds, without changing it: ``directory`` (None
    when the disk cache is disabled), ``entries`` and ``size_bytes`` (complete
    entries only: executables and AOTAutograd results; temporary files of
    writers are not counted; 0 for a directory not created yet), ``max_size_bytes``."""
    folder = cache_dir()
    if folder is None:
        return {"directory": None, "entries": 0, "size_bytes": 0, "max_size_bytes": max_size()}
    entries = _entries(pathlib.Path(folder), remove_stale=False)
    return {"directory": folder, "entries": len(entries),
            "size_bytes": sum(size for _, size, _ in entries), "max_size_bytes": max_size()}


def evict(keep: pathlib.Path | None = None) -> int:
    """Deletes the least recently used entries until the directory is under
    max_size() (never `keep`, the entry just written); returns how many."""
    folder, limit = cache_dir(), max_size()
    if folder is None or limit is None:
        return 0
    entries = sorted(_entries(pathlib.Path(folder)))
    total = sum(size for _, size, _ in entries)
    evicted = freed = 0
    for _, size, path in entries:
        if total <= limit:
            break
        if path == keep:
            continue
        if not _remove(path):
            continue  # not ours to delete (permissions): leave it
        total -= size
        evicted, freed = evicted + 1, freed + size
    if evicted:
        metrics.record_eviction(evicted, freed, folder, limit)
    return evicted


def _write(path: pathlib.Path, payload: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=path.suffix)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(_MAGIC + hashlib.sha256(payload).digest() + payload)
        os.replace(temp, path)
    except BaseException:
        _remove(pathlib.Path(temp))
        raise


def load_bytes(key: str, suffix: str) -> bytes | None:
    """The checked payload stored under key, or None (a miss, the cache off, or
    a corrupted entry, which is reported and removed)."""
    path = _path(key, suffix)
    return None if path is None else _read(path)


def store_bytes(key: str, suffix: str, payload: bytes) -> None:
    """Stores payload under key (nothing when the disk cache is off)."""
    path = _path(key, suffix)
    if path is None:
        return
    try:
        _write(path, payload)
    except OSError as error:  # read-only or full disk, not a directory: keep going without it
        _unusable(path, "write to", error)
        return
    evict(keep=path)


def _custom_call_targets(executable) -> set[str]:
    """The custom-call targets an executable calls, read from its optimized HLO
    (every computation of it, loop and branch bodies included)."""
    return set(_CUSTOM_CALL.findall(executable.as_text()))


@functools.lru_cache(maxsize=1)
def _warm_start_preparations() -> dict:
    """The custom-call targets a deserialized executable may call, each mapped
    to what must run first in the process.

    Lowering does more than emit code: jax registers jaxlib's LAPACK targets
    when it is imported, but their handlers call LAPACK through function
    pointers that only `_lapack.initialize()` sets (loaded from SciPy), and jax
    calls it while lowering a linalg op (jaxlib/lapack.py prepare_lapack_call).
    A warm start skips lowering, so without this the first LAPACK call jumps
    to a null pointer on an XLA worker thread. Targets that XLA itself
    implements need nothing. Targets not listed here (host callbacks, targets
    of other libraries) are not stored: the graph is compiled in every process
    instead."""
    from jax._src.lib import lapack

    preparations = {name: lapack._lapack.initialize for name in lapack._lapack.registrations()}
    return preparations | dict.fromkeys(_XLA_TARGETS, _nothing)


def _nothing() -> None:
    pass


def _prepare(targets) -> None:
    """Runs, once each, what the targets need before the executable runs (a
    KeyError for a target this build does not know: an incompatible entry)."""
    preparations = _warm_start_preparations()
    for prepare in {preparations[target] for target in targets}:
        prepare()


def load(key: str):
    """The executable stored under key (a jax.stages.Compiled), ready to run,
    or None."""
    return load_entry(key)[0]


def load_entry(key: str):
    """(executable, times) stored under key, or (None, None): `times` is
    (lowering seconds, XLA compile seconds) of the build that stored it, for
    the metrics records (compiler/metrics.py), None when not stored."""
    payload = load_bytes(key, _SUFFIX)
    if payload is None:
        return None, None
    from jax.experimental.serialize_executable import deserialize_and_load

    try:
        serialized, in_tree, out_tree, targets, times = pickle.loads(payload)
        _prepare(targets)
        executable = deserialize_and_load(serialized, in_tree, out_tree, backend="cpu")
    except Exception as error:  # written by an incompatible build: same as a bad entry
        discard(key, _SUFFIX, f"could not be loaded ({type(error).__name__}: {error})")
        return None, None
    metrics.record_cache_hit("disk")
    return executable, times


def store(key: str, executable, times: tuple[float, float] | None = None) -> None:
    """Writes the executable under key, with the custom-call targets it needs
    prepared before it runs and `times` (lowering and compile seconds, see
    load_entry); nothing when the disk cache is off, the
    executable cannot be serialized, or it calls a target a warm start could
    not prepare."""
    if cache_dir() is None:
        return
    from jax.experimental.serialize_executable import serialize

    targets = _custom_call_targets(executable)
    unknown = targets - _warm_start_preparations().keys()
    if unknown:
        _log.debug("executable not stored: custom-call targets %s cannot be prepared in a warm start",
                   sorted(unknown))
        return
    try:
        serialized, in_tree, out_tree = serialize(executable)
    except (ValueError, NotImplementedError):
        return
    with io.BytesIO() as buffer:
        pickle.dump((serialized, in_tree, out_tree, sorted(targets), times), buffer,
                    protocol=pickle.HIGHEST_PROTOCOL)
        store_bytes(key, _SUFFIX, buffer.getvalue())
