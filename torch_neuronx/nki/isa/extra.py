"""More `nki.isa` instructions of AWS's current NKI reference (aws-neuron-sdk 81ce03ae,
`nki/api/nki/isa/__init__.py`, Neuron 2.32), and the previous reference's dynamic copies:

- Vector Engine selections: `tensor_copy_predicated`, `select_reduce`, `range_select`;
- the NeuronCore-v4 activations: `exponential` (Vector Engine), `activate2` (Scalar Engine);
- GpSimd Engine: `tensor_partition_reduce`, `local_gather`, `sequence_bounds`;
- DMA: `dma_compute` (a DMA that adds its sources);
- `tensor_copy_dynamic_src` / `tensor_copy_dynamic_dst` (the previous reference, cca37847; removed
  in NKI 0.4): `tensor_copy` at a run-time offset, costed with AWS's `MIN_II_DYNAMIC`.

Semantics and limits are those pages'; docs/nki.md says what the simulator does and where it
differs. The random-number instructions are in isa/rng.py.
"""

from __future__ import annotations

import numpy as np

from .. import dtypes as _dt
from .. import elementwise as _ops
from ..errors import NKIError

FP32_MIN = float(np.finfo(np.float32).min)  # -3.4028235e+38, range_select's only on_false_value


def _isa():
    from .. import isa

    return isa


def require_gen(instr, gen, engine_note=""):
    """NKIError unless the simulated target's NeuronCore generation is at least `gen` (3: trn2, 4: trn3)."""
    from .small import get_nc_version

    have = int(get_nc_version())
    if have < gen:
        names = {2: "trn1", 3: "trn2", 4: "trn3"}
        raise NKIError(instr, f"{engine_note or 'this instruction'} is available only on NeuronCore-v{gen} "
                       f"({names[gen]}) and newer; the simulated target is NeuronCore-v{have} ({names[have]})",
                       f"run on {names[gen]} (NEURON_PLATFORM_TARGET_OVERRIDE={names[gen]} or "
                       f"nki.benchmark(..., target='{names[gen]}'))")


def _op_name(op) -> str | None:
    """An operator's name, for tokens the simulator may not define (nl.bypass, nl.abs_max, ...)."""
    if op is None:
        return None
    if isinstance(op, str):
        return op
    token = op if isinstance(op, _ops.Op) else getattr(op, "_nki_op", None)
    if token is not None:
        return token.name
    name = getattr(op, "name", None) or getattr(op, "__name__", None)
    return _ops._UFUNC_ALIASES.get(name, name)


def _check_dtype(instr, role, t, allowed, fix):
    if t.alloc.dtype_name not in allowed:
        raise NKIError(instr, f"{role} dtype {t.alloc.dtype_name} is not supported (AWS allows "
                       f"{', '.join(allowed)})", fix)


def _not_both_psum(instr, a, b, ra, rb):
    if a.buffer.kind == "psum" and b.buffer.kind == "psum":
        raise NKIError(instr, f"{ra} and {rb} are both in nl.psum; at most one of them may be in PSUM",
                       "copy one of them to SBUF first (nisa.tensor_copy)")


def _predicate(instr, pred, reverse):
    values = pred.data.reshape(pred.partitions, -1)
    keep = values != 0
    return ~keep if reverse else keep


def _with_mask(isa, t, where):
    """`where` ([P, F]) and the active mask, as a boolean of t's shape."""
    where = where.reshape(t.shape)
    mask = isa._mask_for(t)
    return where if mask is None else where & mask


# ---------------------------------------------------------------------------- Vector Engine selections
_PREDICATE_DTYPES = ("uint8", "uint16", "uint32")


def tensor_copy_predicated(dst, src, predicate, reverse_pred=False, name=None):
    """dst = src where `predicate` (uint8/16/32, non-zero is true) holds, dst unchanged elsewhere
    (Vector Engine); `src` a tensor of dst's dtype and layout, or a number; `reverse_pred` inverts
    the predicate. At most one of src and predicate in PSUM."""
    isa = _isa()
    instr = "nisa.tensor_copy_predicated"
    dst = isa._tensor(dst, instr, "dst")
    pred = isa._tensor(predicate, instr, "predicate")
    reads = [("predicate", pred)]
    src_t = None
    if not isinstance(src, (int, float, np.number, bool)):
        src_t = isa._tensor(src, instr, "src")
        reads.insert(0, ("src", src_t))
    isa._access(instr, "vector", reads=reads, writes=[("dst", dst)])
    isa._same_layout(instr, dst, pred, "predicate")
    _check_dtype(instr, "predicate", pred, _PREDICATE_DTYPES, "make the predicate a uint8 (or uint16 / uint32) tile")
    if src_t is not None:
        isa._same_layout(instr, dst, src_t, "src")
        _not_both_psum(instr, src_t, pred, "src", "predicate")
        if src_t.dtype != dst.dtype:
            raise NKIError(instr, f"src dtype {src_t.alloc.dtype_name} differs from dst dtype {dst.alloc.dtype_name}: "
                           "the predicated copy does not convert", "copy (and cast) src into a tile of dst's dtype first")
    where = _with_mask(isa, dst, _predicate(instr, pred, reverse_pred))
    if src_t is not None:
        isa._store(dst, src_t.data.reshape(dst.shape), where)
    else:
        isa._write(dst, np.full(dst.shape, src, np.float32), where)
    fast = "psum" in (pred.buffer.kind, src_t.buffer.kind if src_t is not None else "sbuf")
    isa._record(instr, "vector", [dst], [t for _, t in reads] + [dst], ("tensor_tensor", dst.free_size, fast))


def _reduction(instr, isa, dst, cmd, selected, res):
    """The Vector Engine register protocol shared by select_reduce and range_select (as
    tensor_scalar_reduce): reset / reset_reduce / reduce drive the registers and reduce_res reads
    them; idle leaves this instruction's own reduction in reduce_res, the registers unknown. The
    maximum is of the float32 `selected` values, before the cast into dst (AWS's NumPy equivalents;
    range_select's note: a bfloat16 dst holds -inf where reduce_res holds FP32_MIN)."""
    rtoken = _ops.BINARY["maximum"]
    lanes = isa._lanes(dst)
    keep = isa._input_keep(dst)
    if keep is not None:
        selected = np.where(keep, selected, -np.inf)
    partial = selected.max(axis=1, keepdims=True).astype(np.float32) if cmd != "reset" else None
    if cmd == "idle":
        if isa._issued():
            isa._registers(instr, "vector").known[lanes] = False
        out = partial
    else:
        isa._accumulate(instr, "vector", cmd, lanes, rtoken, partial)
        out = isa._read_registers(instr, "vector", lanes) if res is not None else None
    if res is not None:
        isa._write(res, out)
        return [res]
    return []


def select_reduce(dst, predicate, on_true, on_false, reduce_res=None, reduce_cmd=None, reduce_op=None,
                  reverse_pred=False, name=None):
    """dst = on_true where `predicate` (int8/uint8/int16/uint16, non-zero is true) holds, else
    on_false (a number or [P, 1]); with reduce_res or a reduce_cmd other than idle, the maximum of
    dst per partition through the Vector Engine's accumulation registers (reset_reduce resets
    them to -inf)."""
    isa = _isa()
    instr = "nisa.select_reduce"
    dst = isa._tensor(dst, instr, "dst")
    pred = isa._tensor(predicate, instr, "predicate")
    src = isa._tensor(on_true, instr, "on_true")
    isa._access(instr, "vector", reads=[("predicate", pred), ("on_true", src)], writes=[("dst", dst)])
    isa._same_layout(instr, dst, src, "on_true")
    isa._same_layout(instr, dst, pred, "predicate")
    _not_both_psum(instr, src, pred, "on_true", "predicate")
    if src.alloc.dtype_name in ("tfloat32", "int32", "uint32"):
        raise NKIError(instr, f"on_true dtype {src.alloc.dtype_name} is not supported (AWS: any dtype but tfloat32, "
                       "int32 and uint32)", "copy on_true into a float32 / bfloat16 tile first")
    _check_dtype(instr, "predicate", pred, ("int8", "uint8", "int16", "uint16"),
                 "make the predicate an 8- or 16-bit integer tile")
    if _op_name(reduce_op) not in (None, "maximum"):
        raise NKIError(instr, f"reduce_op {reduce_op!r}: only nl.maximum is supported", "pass reduce_op=nl.maximum")
    cmd = isa._command(reduce_cmd, instr, ("idle", "reduce", "reset_reduce"), "idle")
    res = isa._reduce_operand(instr, reduce_res, dst.partitions, "vector") if reduce_res is not None else None
    if res is not None and not _dt.is_float(res.dtype):
        raise NKIError(instr, f"reduce_res dtype {res.alloc.dtype_name} must be a float type",
                       "allocate reduce_res as nl.float32")
    off, off_t = isa._scalar_operand(on_false, instr, "on_false", dst.partitions, "vector")
    keep = _predicate(instr, pred, reverse_pred)
    selected = np.where(keep, isa._f32_2d(src), off).astype(np.float32)
    isa._write(dst, selected)
    writes = [dst]
    if res is not None or cmd != "idle":
        writes += _reduction(instr, isa, dst, cmd, selected, res)
    reads = [pred, src] + ([off_t] if off_t is not None else [])
    fast = "psum" in (pred.buffer.kind, src.buffer.kind)
    isa._record(instr, "vector", writes, reads, ("tensor_tensor", dst.free_size, fast))


_COMPARISONS = ("equal", "less", "less_equal", "greater", "greater_equal")


def range_select(dst, on_true_tile, comp_op0, comp_op1, bound0, bound1, reduce_cmd=None, reduce_res=None,
                 reduce_op=None, range_start=0, on_false_value=Ellipsis, name=None):
    """dst = on_true_tile where comp_op0(j, bound0) and comp_op1(j, bound1) hold for j =
    range_start + the element's free index (compared in float32), else FP32_MIN; the maximum of
    dst per partition through the Vector Engine's accumulation registers (reduce_cmd default
    reset_reduce; reduce_res [P, 1] receives them). NeuronCore-v3 and newer."""
    isa = _isa()
    instr = "nisa.range_select"
    require_gen(instr, 3)
    dst = isa._tensor(dst, instr, "dst")
    src = isa._tensor(on_true_tile, instr, "on_true_tile")
    b0, b1 = isa._tensor(bound0, instr, "bound0"), isa._tensor(bound1, instr, "bound1")
    isa._access(instr, "vector", reads=[("on_true_tile", src), ("bound0", b0), ("bound1", b1)], writes=[("dst", dst)])
    isa._same_layout(instr, dst, src, "on_true_tile")
    ops = []
    for role, op in (("comp_op0", comp_op0), ("comp_op1", comp_op1)):
        token = _ops.resolve(op, instr, 2)
        if token.name not in _COMPARISONS:
            raise NKIError(instr, f"{role} {token!r} is not a comparison", "use nl.equal, nl.less, nl.less_equal, "
                           "nl.greater or nl.greater_equal")
        ops.append(token)
    for role, b in (("bound0", b0), ("bound1", b1)):
        if b.partitions != src.partitions or b.free_size != 1:
            raise NKIError(instr, f"{role} shape {b.shape} must hold one value per partition ([{src.partitions}, 1])")
        if b.dtype != _dt.float32:
            raise NKIError(instr, f"{role} dtype {b.alloc.dtype_name} must be float32", "copy the bound into a "
                           "float32 [P, 1] tile")
    if not _dt.is_float(src.dtype):
        raise NKIError(instr, f"on_true_tile dtype {src.alloc.dtype_name} must be a floating-point type")
    if on_false_value is not Ellipsis and np.float32(on_false_value) != np.float32(FP32_MIN):
        raise NKIError(instr, f"on_false_value={on_false_value!r}: the hardware fills with FP32_MIN "
                       "(-3.4028235e+38) only", "pass on_false_value=nl.fp32.min (or omit it)")
    if int(range_start) != range_start:
        raise NKIError(instr, f"range_start={range_start!r} must be a compile-time integer")
    if abs(int(range_start)) + src.free_size > 2 ** 24:
        raise NKIError(instr, f"range_start {range_start} + {src.free_size} free indices leaves the 2^24 range in "
                       "which float32 compares integers exactly", "keep range_start + the free size below 2^24")
    if _op_name(reduce_op) not in (None, "maximum"):
        raise NKIError(instr, f"reduce_op {reduce_op!r}: only nl.maximum is supported", "pass reduce_op=nl.maximum")
    cmd = isa._command(reduce_cmd, instr, ("idle", "reset", "reduce", "reset_reduce"), "reset_reduce")
    res = isa._reduce_operand(instr, reduce_res, dst.partitions, "vector") if reduce_res is not None else None
    index = np.float32(int(range_start)) + np.arange(src.free_size, dtype=np.float32)[None, :]
    keep = (ops[0].fn(index, isa._f32_2d(b0)) != 0) & (ops[1].fn(index, isa._f32_2d(b1)) != 0)
    selected = np.where(keep, isa._f32_2d(src), np.float32(FP32_MIN)).astype(np.float32)
    isa._write(dst, selected)
    writes = [dst] + _reduction(instr, isa, dst, cmd, selected, res)
    isa._record(instr, "vector", writes, [src, b0, b1], ("elementwise", dst.free_size))


# ---------------------------------------------------------------------------- NeuronCore-v4 activations
_EXP_DST = ("float8_e4m3", "float8_e4m3fn", "float8_e5m2", "float16", "bfloat16", "float32", "tfloat32", "int8",
            "int16", "int32", "uint8", "uint16")


def exponential(dst, src, max_value=0.0, reduce_res=None, reduce_cmd=None, reduce_init=0.0, name=None):
    """dst = exp(src - max_value) on the Vector Engine (max_value a number or [P, 1]); with
    reduce_cmd reset_reduce / reduce / load_reduce the sum of dst accumulates in the Vector
    Engine's registers (load_reduce starts from reduce_init) and reduce_res [P, 1] receives them.
    NeuronCore-v4 and newer."""
    isa = _isa()
    instr = "nisa.exponential"
    require_gen(instr, 4)
    dst, src = isa._tensor(dst, instr, "dst"), isa._tensor(src, instr, "src")
    isa._access(instr, "vector", reads=[("src", src)], writes=[("dst", dst)])
    isa._same_layout(instr, dst, src, "src")
    if src.ndim > 4 or dst.ndim > 4:
        raise NKIError(instr, f"src {src.shape} / dst {dst.shape}: at most 4-D tensors", "reshape to at most 4 axes")
    _check_dtype(instr, "dst", dst, _EXP_DST, "allocate dst as float32 or bfloat16")
    cmd = isa._command(reduce_cmd, instr, ("idle", "reduce", "reset_reduce", "load_reduce"), "idle")
    loading = cmd == "load_reduce"
    if not loading and not (isinstance(reduce_init, (int, float, np.number)) and reduce_init == 0):
        raise NKIError(instr, f"reduce_init={reduce_init!r} with reduce_cmd={cmd}: reduce_init is what load_reduce "
                       "loads, and must be unset or 0.0 otherwise", "pass reduce_cmd=nisa.reduce_cmd.load_reduce")
    res = isa._reduce_operand(instr, reduce_res, dst.partitions, "vector") if reduce_res is not None else None
    if res is not None and cmd == "idle":
        raise NKIError(instr, "reduce_cmd=idle accumulates nothing (AWS: the registers' state is then unknown), so "
                       "reduce_res would read nothing defined", "pass reduce_cmd=nisa.reduce_cmd.reset_reduce")
    reads = [src]
    m, mt = isa._scalar_operand(max_value, instr, "max_value", src.partitions, "vector")
    reads += [mt] if mt is not None else []
    result = _ops.UNARY["exp"].fn(isa._f32_2d(src) - m)
    isa._write(dst, result)
    writes = [dst]
    lanes = isa._lanes(dst)
    add = _ops.BINARY["add"]
    if cmd == "idle":
        if isa._issued():
            isa._registers(instr, "vector").known[lanes] = False
    else:
        init = None
        if loading:
            init, it = isa._scalar_operand(reduce_init, instr, "reduce_init", src.partitions, "vector")
            init = np.broadcast_to(init, (src.partitions, 1)).reshape(-1)
            reads += [it] if it is not None else []
        isa._accumulate(instr, "vector", cmd, lanes, add, isa._partial_reduce(dst, add, result), init)
        if res is not None:
            isa._write(res, isa._read_registers(instr, "vector", lanes))
            writes.append(res)
    isa._record(instr, "vector", writes, reads, ("elementwise", dst.free_size))


# activate2's tensor-scalar stage: the (op0, op1) pairs AWS supports (None: nl.bypass).
_ACTIVATE2_PAIRS = {("multiply", "add"), ("multiply", "subtract"), ("multiply", None), ("add", None),
                    ("subtract", None), (None, None)}
_ABS_REDUCTIONS = {"abs_max": (np.float32(0.0), lambda a, b: np.maximum(np.abs(a), np.abs(b))),
                   "abs_min": (np.float32(np.inf), lambda a, b: np.minimum(np.abs(a), np.abs(b)))}


def _bypass(op) -> str | None:
    name = _op_name(op)
    return None if name in (None, "bypass") else name


def activate2(dst, op, data, imm0, imm1, op0, op1, relu_param=0.0, reverse0=False, reverse1=False, reduce_op=None,
              reduce_res=None, reduce_cmd=None, name=None):
    """dst = op((data <op0> imm0) <op1> imm1) on the Scalar Engine (imm a number or [P, 1]; op0 /
    op1 one of AWS's six pairs, nl.bypass or None for no operation), with activation's
    accumulation-register reduction (reduce_op add, maximum, minimum, abs_max, abs_min).
    NeuronCore-v4 and newer."""
    isa = _isa()
    instr = "nisa.activate2"
    require_gen(instr, 4)
    dst, data = isa._tensor(dst, instr, "dst"), isa._tensor(data, instr, "data")
    token = _ops.resolve(op, instr, 1)
    isa._access(instr, "scalar", reads=[("data", data)], writes=[("dst", dst)])
    isa._same_layout(instr, dst, data)
    pair = (_bypass(op0), _bypass(op1))
    if pair[0] is None and pair[1] is not None:
        raise NKIError(instr, "op1 is set but op0 is nl.bypass: op1 requires op0", "set op0, or move the operation to op0")
    if pair not in _ACTIVATE2_PAIRS:
        raise NKIError(instr, f"(op0, op1) = ({pair[0] or 'bypass'}, {pair[1] or 'bypass'}) is not one of the six "
                       "tensor-scalar combinations", "use (multiply, add), (multiply, subtract), (multiply, bypass), "
                       "(add, bypass), (subtract, bypass) or (bypass, bypass)")
    for flag, which, role in ((reverse0, pair[0], "reverse0"), (reverse1, pair[1], "reverse1")):
        if flag and which is None:
            raise NKIError(instr, f"{role}=True requires its operation to be set (it is nl.bypass)")
    if isinstance(imm0, type(data)) and isinstance(imm1, type(data)) and imm0.dtype != imm1.dtype:
        raise NKIError(instr, f"imm0 ({imm0.alloc.dtype_name}) and imm1 ({imm1.alloc.dtype_name}) must have the same "
                       "dtype when both are tensors")
    if not (isinstance(relu_param, (int, float, np.number)) and relu_param == 0):
        raise NKIError(instr, f"relu_param={relu_param!r}: it parameterizes activation functions such as PReLU, "
                       "which the simulator does not provide", "leave relu_param at 0.0")
    cmd = isa._command(reduce_cmd, instr, ("idle", "reset", "reduce", "reset_reduce"), "idle")
    rname = _op_name(reduce_op) or "add"
    if rname not in ("add", "maximum", "minimum", "abs_max", "abs_min"):
        raise NKIError(instr, f"reduce_op {reduce_op!r} cannot reduce into the Scalar Engine's registers",
                       "use nl.add, nl.maximum, nl.minimum, nl.abs_max or nl.abs_min")
    res = isa._reduce_operand(instr, reduce_res, data.partitions, "scalar") if reduce_res is not None else None
    x = isa._f32_2d(data)
    reads = [data]
    for name_, imm, rev, role in ((pair[0], imm0, reverse0, "imm0"), (pair[1], imm1, reverse1, "imm1")):
        if name_ is None:
            continue
        value, t = isa._scalar_operand(imm, instr, role, data.partitions, "scalar")
        reads += [t] if t is not None else []
        fn = _ops.BINARY[name_].fn
        x = fn(value, x) if rev else fn(x, value)
    result = token.fn(x)
    isa._write(dst, result)
    writes = [dst]
    lanes = isa._lanes(data)
    if cmd != "idle":
        if rname in _ABS_REDUCTIONS:
            identity, fn = _ABS_REDUCTIONS[rname]
            _abs_accumulate(instr, isa, cmd, lanes, identity, fn, dst, result)
        else:
            rtoken = _ops.BINARY[rname]
            isa._accumulate(instr, "scalar", cmd, lanes, rtoken,
                            isa._partial_reduce(dst, rtoken, result) if cmd != "reset" else None)
    if res is not None:
        isa._write(res, isa._read_registers(instr, "scalar", lanes))
        writes.append(res)
    isa._record(instr, "scalar", writes, reads, ("elementwise", dst.free_size))


def _abs_accumulate(instr, isa, cmd, lanes, identity, fn, dst, result):
    """The registers with abs_max / abs_min (tokens the register helpers do not know)."""
    if not isa._issued():
        return
    regs = isa._registers(instr, "scalar")
    if cmd in ("reset", "reset_reduce"):
        regs.values[lanes] = identity
        regs.known[lanes] = True
    if cmd == "reset":
        return
    if not regs.known[lanes].all():
        raise NKIError(instr, f"reduce_cmd={cmd} accumulates onto the Scalar Engine's accumulation registers of "
                       f"partitions {lanes.start}..{lanes.stop - 1}, but no instruction of this program has set them",
                       "start with reduce_cmd=nisa.reduce_cmd.reset_reduce")
    written = isa._masked_input(dst, isa._as_written(dst, result), identity)
    partial = np.abs(written).max(axis=1) if identity == 0 else np.abs(written).min(axis=1)
    regs.values[lanes] = fn(regs.values[lanes], partial)


# ---------------------------------------------------------------------------- GpSimd Engine
_PARTITION_REDUCE_OPS = {"add": "add", "maximum": "maximum", "max": "maximum", "average": "average",
                         "mean": "average", "bitwise_or": "bitwise_or", "bitwise_and": "bitwise_and"}


def tensor_partition_reduce(dst, op, data, name=None):
    """dst[1, ...] = the reduction of data over its partitions (GpSimd Engine): add, average,
    maximum, bitwise_or, bitwise_and (the bitwise ones on integer tiles)."""
    isa = _isa()
    instr = "nisa.tensor_partition_reduce"
    dst, data = isa._tensor(dst, instr, "dst"), isa._tensor(data, instr, "data")
    isa._access(instr, "gpsimd", reads=[("data", data)], writes=[("dst", dst)])
    kind = _PARTITION_REDUCE_OPS.get(_op_name(op))
    if kind is None:
        raise NKIError(instr, f"operator {op!r} cannot reduce across partitions",
                       "use nl.add, nl.maximum, nl.bitwise_or, nl.bitwise_and or average")
    if dst.partitions != 1 or dst.free_size != data.free_size:
        raise NKIError(instr, f"dst shape {dst.shape} must be one partition of data's free size "
                       f"([1, {data.free_size}] for data {data.shape})")
    if kind.startswith("bitwise"):
        if not (np.issubdtype(data.data.dtype, np.integer) and np.issubdtype(dst.data.dtype, np.integer)):
            raise NKIError(instr, f"{kind} needs integer tiles (data {data.alloc.dtype_name}, dst "
                           f"{dst.alloc.dtype_name})", "use nl.add / nl.maximum for float data")
        values = data.data.reshape(data.partitions, -1)
        result = (np.bitwise_or if kind == "bitwise_or" else np.bitwise_and).reduce(values, axis=0, keepdims=True)
        isa._store(dst, result.astype(dst.data.dtype).reshape(dst.shape))
    else:
        values = isa._f32_2d(data)
        result = {"add": lambda v: v.sum(0, keepdims=True), "maximum": lambda v: v.max(0, keepdims=True),
                  "average": lambda v: v.mean(0, keepdims=True)}[kind](values)
        isa._write(dst, result.astype(np.float32))
    isa._record(instr, "gpsimd", [dst], [data], ("gpsimd", data.free_size))


_GATHER_ELEMS = (1, 2, 4, 8, 16, 32)
_GPSIMD_CORE_PARTITIONS = 16
_GATHER_MAX_INDICES = 4096


def local_gather(dst, src_buffer, index, num_elem_per_idx=1, num_valid_indices=None, name=None):
    """Per GpSimd core (16 partitions): its `index` slice (uint16) flattened partition first, the
    first `num_valid_indices` of them; each partition p of the core gets, for each index i, the
    `num_elem_per_idx` elements of src_buffer[p] starting at element i (free axes flattened), in
    index order. dst: src_buffer's dtype and partitions, num_valid_indices * num_elem_per_idx
    elements per partition."""
    isa = _isa()
    instr = "nisa.local_gather"
    dst = isa._tensor(dst, instr, "dst")
    src = isa._tensor(src_buffer, instr, "src_buffer")
    idx = isa._tensor(index, instr, "index")
    isa._access(instr, "gpsimd", reads=[("src_buffer", src), ("index", idx)], writes=[("dst", dst)])
    p = src.partitions
    if idx.partitions != p or p % _GPSIMD_CORE_PARTITIONS:
        raise NKIError(instr, f"src_buffer has {p} partitions and index {idx.partitions}: they must be equal and a "
                       "multiple of 16 (each GpSimd core gathers within its 16 partitions)",
                       "pad both to a multiple of 16 partitions")
    if idx.alloc.dtype_name != "uint16":
        raise NKIError(instr, f"index dtype {idx.alloc.dtype_name} must be uint16", "copy the indices into a uint16 tile")
    if num_elem_per_idx not in _GATHER_ELEMS:
        raise NKIError(instr, f"num_elem_per_idx={num_elem_per_idx!r} must be one of {list(_GATHER_ELEMS)}")
    per_core = _GPSIMD_CORE_PARTITIONS * idx.free_size
    valid = per_core if num_valid_indices is None else int(num_valid_indices)
    if not 0 < valid <= per_core:
        raise NKIError(instr, f"num_valid_indices={num_valid_indices} must be 1 to the {per_core} indices of a "
                       "16-partition index slice")
    if valid > _GATHER_MAX_INDICES:
        raise NKIError(instr, f"{valid} indices per GpSimd core, more than {_GATHER_MAX_INDICES}",
                       "split the gather into several instructions")
    if dst.dtype != src.dtype:
        raise NKIError(instr, f"dst dtype {dst.alloc.dtype_name} differs from src_buffer's {src.alloc.dtype_name}: "
                       "local_gather does not convert", "gather into a tile of src_buffer's dtype")
    if dst.partitions != p or dst.free_size != valid * num_elem_per_idx:
        raise NKIError(instr, f"dst shape {dst.shape} must hold {p} partitions of {valid} x {num_elem_per_idx} "
                       "elements (num_valid_indices x num_elem_per_idx)")
    values = src.data.reshape(p, -1)
    indices = idx.data.reshape(p, -1).astype(np.int64)
    out = np.empty((p, valid, num_elem_per_idx), values.dtype)
    span = np.arange(num_elem_per_idx)
    for core in range(p // _GPSIMD_CORE_PARTITIONS):
        rows = slice(core * _GPSIMD_CORE_PARTITIONS, (core + 1) * _GPSIMD_CORE_PARTITIONS)
        flat = indices[rows].flatten(order="F")[:valid]
        bad = flat + num_elem_per_idx > values.shape[1]
        if bad.any():
            raise NKIError(instr, f"index {int(flat[bad][0])} (GpSimd core {core}) + {num_elem_per_idx} elements "
                           f"leaves src_buffer's {values.shape[1]} elements per partition (AWS: undefined behavior)",
                           "keep every index + num_elem_per_idx within src_buffer's free size")
        out[rows] = values[rows][:, flat[:, None] + span[None, :]]
    isa._store(dst, out.reshape(dst.shape))
    isa._record(instr, "gpsimd", [dst], [src, idx],
                ("local_gather", valid, num_elem_per_idx, np.dtype(src.data.dtype).itemsize))


def sequence_bounds(dst, segment_ids, name=None):
    """For segment ids [1, n] (float32 or int32; 0 is padding): dst[1, 2, n] holds, per element,
    the start index and the end index (exclusive) of its segment (a run of equal ids); padding gets
    (n, -1). GpSimd Engine."""
    isa = _isa()
    instr = "nisa.sequence_bounds"
    dst, seg = isa._tensor(dst, instr, "dst"), isa._tensor(segment_ids, instr, "segment_ids")
    isa._access(instr, "gpsimd", reads=[("segment_ids", seg)], writes=[("dst", dst)])
    for role, t in (("segment_ids", seg), ("dst", dst)):
        _check_dtype(instr, role, t, ("float32", "int32"), "use a float32 or int32 tile")
    if seg.partitions != 1:
        raise NKIError(instr, f"segment_ids has {seg.partitions} partitions; the partition dimension must be 1",
                       "put the sequence on one partition ([1, n])")
    n = seg.free_size
    if dst.partitions != 1 or dst.free_size != 2 * n:
        raise NKIError(instr, f"dst shape {dst.shape} must be [1, 2, {n}] (start and end per element)")
    ids = isa._f32_2d(seg)[0]
    if (ids < 0).any() or (ids != np.floor(ids)).any():
        raise NKIError(instr, "segment ids must be non-negative integers", "use 0 for padding and 1, 2, ... for segments")
    pos = np.arange(n)
    new = np.ones(n, bool)
    new[1:] = ids[1:] != ids[:-1]
    start = np.maximum.accumulate(np.where(new, pos, 0))
    last = np.ones(n, bool)
    last[:-1] = ids[:-1] != ids[1:]
    end = np.minimum.accumulate(np.where(last, pos + 1, n)[::-1])[::-1]
    pad = ids == 0
    bounds = np.stack([np.where(pad, n, start), np.where(pad, -1, end)]).astype(np.float32)
    isa._write(dst, bounds.reshape(1, -1))
    isa._record(instr, "gpsimd", [dst], [seg], ("gpsimd", dst.free_size))


# ---------------------------------------------------------------------------- DMA
_DMA_COMPUTE_MAX_SRCS = 16


def dma_compute(dst, srcs, reduce_op, scales=None, unique_indices=True, oob_mode=None, name=None):
    """dst = srcs[0] + srcs[1] + ... computed in float32 by the DMA engines (HBM or SBUF), cast
    to dst's dtype. AWS supports only reduce_op=nl.add and scales of 1.0 (None); at most 16
    sources, each with dst's element count. dst may be one of the sources."""
    isa = _isa()
    instr = "nisa.dma_compute"
    dst = isa._tensor(dst, instr, "dst")
    if not isinstance(srcs, (list, tuple)) or not srcs:
        raise NKIError(instr, f"srcs must be a non-empty list of tensors, got {type(srcs).__name__}")
    if len(srcs) > _DMA_COMPUTE_MAX_SRCS:
        raise NKIError(instr, f"{len(srcs)} source tensors, more than {_DMA_COMPUTE_MAX_SRCS}",
                       "add them in several dma_compute instructions")
    sources = [isa._tensor(s, instr, f"srcs[{i}]") for i, s in enumerate(srcs)]
    isa._access(instr, "dma", reads=[(f"srcs[{i}]", s) for i, s in enumerate(sources)], writes=[("dst", dst)])
    if _op_name(reduce_op) != "add":
        raise NKIError(instr, f"reduce_op {reduce_op!r}: only nl.add is supported", "pass reduce_op=nl.add")
    if scales is not None:
        if len(scales) != len(sources):
            raise NKIError(instr, f"{len(scales)} scales for {len(sources)} sources", "give one scale per source")
        if any(float(s) != 1.0 for s in scales):
            raise NKIError(instr, f"scales={list(scales)}: every scale must be 1.0", "scale the sources first, or "
                           "pass scales=None")
    if not unique_indices:
        raise NKIError(instr, "unique_indices=False (non-unique scatter indices) is not supported yet by AWS",
                       "pass unique_indices=True")
    for i, s in enumerate(sources):
        if s.data.size != dst.data.size:
            raise NKIError(instr, f"srcs[{i}] has {s.data.size} elements, dst {dst.data.size}: every source must "
                           "have dst's element count")
    total = np.zeros(dst.data.size, np.float32)
    for s in sources:
        total += s.data.reshape(-1).astype(np.float32)
    isa._write(dst, total.reshape(dst.shape))
    nbytes = sum(s.nbytes for s in sources)
    side = dst if dst.buffer.on_chip else next((s for s in sources if s.buffer.on_chip), dst)
    isa._record(instr, "dma", [dst], sources, ("dma", nbytes, nbytes / max(1, side.partitions if side.ndim else 1)),
                nbytes=nbytes)


# ---------------------------------------------------------------------------- the previous reference's dynamic copies
def _copy_dynamic(instr, dst, src, engine):
    isa = _isa()
    dst, src = isa._tensor(dst, instr, "dst"), isa._tensor(src, instr, "src")
    eng = isa._engine(engine, "vector", ("vector", "scalar", "gpsimd"), instr)
    isa._access(instr, eng, reads=[("src", src)], writes=[("dst", dst)])
    isa._same_layout(instr, dst, src, "src")
    if dst.dtype == src.dtype and dst.dtype is not _dt.tfloat32:
        isa._store(dst, src.data.reshape(dst.shape))
    else:
        isa._write(dst, isa._f32(src))
    isa._record(instr, eng, [dst], [src], ("dynamic", src.free_size))


def tensor_copy_dynamic_dst(*, dst, src, dtype=None, engine=None, name=None):
    """tensor_copy into a `dst` view indexed at a run-time offset (a one-element SBUF tile used
    as an index, or `.ap(scalar_offset=)`), costed max(600, N) (AWS's MIN_II_DYNAMIC). The
    previous reference's name (removed in NKI 0.4: use tensor_copy with .ap(scalar_offset=))."""
    _copy_dynamic("nisa.tensor_copy_dynamic_dst", dst, src, engine)
    return dst


def tensor_copy_dynamic_src(src, *, dst=None, dtype=None, engine=None, name=None):
    """A copy of `src`, a view indexed at a run-time offset, into a new SBUF tile (`dtype`, else
    src's) or `dst`; costed max(600, N) (AWS's MIN_II_DYNAMIC). The previous reference's name."""
    instr = "nisa.tensor_copy_dynamic_src"
    isa = _isa()
    src = isa._tensor(src, instr, "src")
    if dst is None:
        from ..runtime import current
        from ..tensor import sbuf

        dst = current(instr).allocate(tuple(src.shape), dtype or src.dtype, sbuf, None, instruction=instr)
    _copy_dynamic(instr, dst, src, engine)
    return dst


# ---------------------------------------------------------------------------- the previous reference's value forms
def _new_tile(instr, shape, dtype):
    from ..runtime import current
    from ..tensor import sbuf

    return current(instr).allocate(tuple(shape), dtype, sbuf, None, instruction=instr)


def tensor_partition_reduce_value(op, data, *, dtype=None, name=None):
    """The previous reference's form: data reduced over its partitions into a new [1, ...] SBUF tile."""
    instr = "nisa.tensor_partition_reduce"
    data = _isa()._tensor(data, instr, "data")
    dst = _new_tile(instr, (1,) + tuple(data.shape[1:]), dtype or data.dtype)
    tensor_partition_reduce(dst, op, data)
    return dst


def local_gather_value(src_buffer, index, num_elem_per_idx=1, num_valid_indices=None, *, name=None):
    """The previous reference's form: a new SBUF tile [P, num_valid_indices, num_elem_per_idx]."""
    instr = "nisa.local_gather"
    isa = _isa()
    src, idx = isa._tensor(src_buffer, instr, "src_buffer"), isa._tensor(index, instr, "index")
    valid = _GPSIMD_CORE_PARTITIONS * idx.free_size if num_valid_indices is None else int(num_valid_indices)
    dst = _new_tile(instr, (src.partitions, valid, num_elem_per_idx), src.dtype)
    local_gather(dst, src, idx, num_elem_per_idx, num_valid_indices)
    return dst


def sequence_bounds_value(*, segment_ids, dtype=None, name=None):
    """The previous reference's form: a new SBUF tile [1, 2, n] (`dtype`, else segment_ids')."""
    instr = "nisa.sequence_bounds"
    seg = _isa()._tensor(segment_ids, instr, "segment_ids")
    dst = _new_tile(instr, (1, 2, seg.free_size), dtype or seg.dtype)
    sequence_bounds(dst, seg)
    return dst


def range_select_value(*, on_true_tile, comp_op0, comp_op1, bound0, bound1, reduce_cmd=None, reduce_res=None,
                       reduce_op=None, range_start=0, on_false_value=Ellipsis, dtype=None, name=None):
    """The previous reference's form (keyword-only, reduce_cmd default idle): a new SBUF tile."""
    from .constants import reduce_cmd as _cmds

    instr = "nisa.range_select"
    src = _isa()._tensor(on_true_tile, instr, "on_true_tile")
    dst = _new_tile(instr, src.shape, dtype or src.dtype)
    range_select(dst, src, comp_op0, comp_op1, bound0, bound1, _cmds.idle if reduce_cmd is None else reduce_cmd,
                 reduce_res, reduce_op, range_start, on_false_value)
    return dst
