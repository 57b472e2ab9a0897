"""State of one simulated launch: target, program ids, on-chip capacity, instruction trace.

Instructions execute eagerly as the kernel's Python runs (loops and `if` are ordinary Python),
and each one appends a `Instr` record to the trace that the cost model schedules afterwards.

Capacity: every SBUF/PSUM `nl.ndarray` occupies its bytes per partition (PSUM: whole 2 KiB banks)
from its first use to its last, as AWS's allocator places it (liveness.py); the check runs over
those lifetimes when the program ends. A tile no instruction uses lives until Python drops it.
"""

from __future__ import annotations

import math
import threading
import weakref

import numpy as np

from . import dtypes as _dt
from .errors import NKIError, kernel_location
from .liveness import Lifetimes, check as _check_lifetimes
from .targets import Target
from .tensor import Allocation, Buffer, NkiTensor, box

PMAX = 128

# The launch in progress, per thread (two threads may simulate kernels at the same time).
_LOCAL = threading.local()


class Instr:
    """One executed instruction, as recorded for the cost model (see `as_dict`)."""

    __slots__ = ("index", "op", "engine", "location", "cost", "reads", "writes",
                 "shapes", "dtypes", "buffers", "nbytes", "flops", "matmul_dtype", "after")

    def as_dict(self) -> dict:
        return {"index": self.index, "op": self.op, "engine": self.engine, "location": self.location,
                "shapes": self.shapes, "dtypes": self.dtypes, "buffers": self.buffers,
                "bytes": self.nbytes, "flops": self.flops, "cost": self.cost}

    def __repr__(self):
        return (f"Instr({self.index}, {self.op}, engine={self.engine}, shapes={self.shapes}, "
                f"dtypes={self.dtypes}, buffers={self.buffers}, bytes={self.nbytes}, at {self.location})")


class _Launch:
    """What every program of one launch shares: the instruction trace, the shared_hbm outputs, the
    random generator, and the cores' scheduler (cores.Cores, for core_barrier / sendrecv)."""

    __slots__ = ("trace", "shared", "rng", "cores")

    def __init__(self):
        self.trace: list[Instr] = []
        self.shared: list[Allocation] = []
        self.rng = None
        self.cores = None


class Run:
    """One program's view of a launch. A grid launch makes one Run per program (`fork`): each
    program is a NeuronCore with its own SBUF/PSUM (capacity, direct allocations), accumulation
    registers and mask, and all share the launch's trace, shared_hbm tensors and generator."""

    def __init__(self, target: Target, grid: tuple, launch: _Launch | None = None):
        self.target = target
        self.grid = grid
        self.program_id = (0,) * len(grid)
        self.core = 0  # the program's linear index in the grid: its core in core_barrier / sendrecv
        self.gid = 0  # its index among all programs the scheduler runs (cores.Cores)
        self.world_rank, self.world_size = 0, 1  # its rank for nki.collectives (nki.multi_rank_simulate)
        self.launch = launch if launch is not None else _Launch()
        self.programs: list[Run] = []  # the per-program Runs a grid launch forked (kernel.launch)
        self.lifetimes = Lifetimes()  # its SBUF/PSUM tiles' lifetimes: capacity (liveness.check)
        self.peak_sbuf = 0
        self.peak_psum_banks = 0
        self.mask = None  # the older dialect's mask= of the instruction being executed (indexing.Mask array)
        self.shared_index = 0  # how many shared_hbm tensors this program has allocated
        # The engines' accumulation registers (nisa.reduce_cmd), per engine name: see isa.Accumulators.
        # Reset (state unknown) at the start of every program of the grid.
        self.accumulators: dict = {}
        # Direct allocation (allocation.py): physical memory per buffer kind, its per-dtype views.
        self.direct_memory: dict = {}
        self.direct_allocs: dict = {}
        self.direct_ids: dict = {}
        self.direct_acc: dict = {}  # PSUM: the accumulation-group state of the physical memory
        self.last_record = None  # the Instr this program recorded last (what nisa calls return)
        self.rng_states: dict = {}  # the engines' random generator states per lane (isa/rng.py)
        # A kernel written for NKI 0.1.0 (`neuronxcc.nki`, v0_1.written_for_nki_0_1): the rules
        # that version had (nisa.affine_select from PSUM) and its nl loops (v0_1.LoopTrace).
        self.nki_0_1 = False
        self.loop_trace = None

    def fork(self, program_id: tuple, core: int) -> "Run":
        """The Run of one program of this launch's grid."""
        child = Run(self.target, self.grid, self.launch)
        child.program_id = program_id
        child.core = core
        self.programs.append(child)
        return child

    # Shared by every program of the launch.
    @property
    def trace(self) -> list:
        return self.launch.trace

    @property
    def shared(self) -> list:
        return self.launch.shared  # shared_hbm allocations, reused by every program

    @property
    def rng(self):
        return self.launch.rng  # nisa.dropout's generator (nl.random_seed), created on first use

    @rng.setter
    def rng(self, value):
        self.launch.rng = value

    @property
    def cores(self):
        return self.launch.cores

    # ------------------------------------------------------------------ memory
    def allocate(self, shape, dtype, buffer, name=None, instruction="nl.ndarray", address=None) -> NkiTensor:
        from . import allocation as _al
        blocks = _partition_axis(shape)
        shape = _check_shape(shape, instruction)
        if address is not None:
            if not isinstance(buffer, Buffer) or not buffer.on_chip:
                raise NKIError(instruction, f"address= places an nl.sbuf or nl.psum tensor, got buffer={buffer!r}")
            buffer = _al.fixed(buffer.kind, address)
        if isinstance(buffer, _al.DirectBuffer):
            if shape[blocks] > PMAX:
                raise NKIError(instruction, f"partition dimension {shape[blocks]} of shape {shape} exceeds "
                               f"nl.tile_size.pmax ({PMAX})")
            return _al.allocate(self, shape, blocks, _dt.normalize(dtype, instruction), buffer, instruction)
        if buffer is None:
            buffer = _default_buffer()
        elif not isinstance(buffer, Buffer):
            raise NKIError(instruction, f"buffer must be nl.sbuf, nl.psum, nl.hbm or nl.shared_hbm, got {buffer!r}")
        dtype = _dt.normalize(dtype, instruction)
        if buffer.kind == "hbm":
            return self._allocate_hbm(shape, dtype, buffer, name)
        if not shape:
            raise NKIError(instruction, f"an {buffer!r} tensor needs a partition dimension, got shape ()")
        if shape[blocks] > PMAX:
            raise NKIError(instruction, f"partition dimension {shape[blocks]} of shape {shape} exceeds "
                           f"nl.tile_size.pmax ({PMAX})", "tile the partition axis into chunks of at most 128")
        # Block axes before nl.par_dim: stored partition-major, so a partition holds blocks x free bytes.
        physical = (shape[blocks],) + shape[:blocks] + shape[blocks + 1:]
        per_partition = math.prod(physical[1:]) * _dt.storage_dtype(dtype).itemsize
        alloc = Allocation(physical, dtype, buffer, name)
        if buffer.kind == "sbuf":
            self._fits_sbuf(per_partition, shape, instruction)
            self.lifetimes.allocated(alloc.id, "sbuf", per_partition, shape, instruction)
        else:
            banks = self._psum_banks(per_partition, shape, instruction,
                                     block_bytes=math.prod(shape[blocks + 1:]) * _dt.storage_dtype(dtype).itemsize
                                     if blocks else None)
            alloc.acc = np.zeros(alloc.storage.nbytes, np.uint8)  # matmul accumulation groups (isa.ACC_*)
            self.lifetimes.allocated(alloc.id, "psum", banks, shape, instruction)
        weakref.finalize(alloc, self.lifetimes.dropped, alloc.id)
        if not blocks:
            return NkiTensor(alloc, alloc.storage)
        alloc.whole = False
        logical = alloc.storage.transpose(tuple(range(1, blocks + 1)) + (0,) + tuple(range(blocks + 1, len(shape))))
        return NkiTensor(alloc, logical, 0, lead=blocks)

    def _allocate_hbm(self, shape, dtype, buffer, name):
        if buffer.name == "shared_hbm" and len(self.grid) > 0:
            # Every program of a grid sees the same shared output: the k-th shared allocation of
            # each program is the same tensor.
            if self.shared_index < len(self.shared):
                alloc = self.shared[self.shared_index]
                self.shared_index += 1
                if alloc.storage.shape != shape or alloc.dtype != dtype:
                    raise NKIError("nl.ndarray", "programs of one grid allocated different shared_hbm tensors "
                                   f"({alloc.storage.shape} vs {shape})",
                                   "allocate shared outputs identically in every program")
                return NkiTensor(alloc, alloc.storage)
            alloc = Allocation(shape, dtype, buffer, name)
            self.shared.append(alloc)
            self.shared_index += 1
            return NkiTensor(alloc, alloc.storage)
        alloc = Allocation(shape, dtype, buffer, name)
        return NkiTensor(alloc, alloc.storage)

    def _fits_sbuf(self, nbytes, shape, instruction):
        cap = self.target.sbuf_bytes_per_partition
        if nbytes > cap:
            raise NKIError(instruction, f"SBUF capacity exceeded: a {shape} tile needs {nbytes} bytes per "
                           f"partition, more than the {cap} there are ({self.target.name})", "use smaller tiles")

    def _psum_banks(self, nbytes, shape, instruction, block_bytes=None) -> int:
        bank = self.target.psum_bank_bytes
        banks = max(1, -(-nbytes // bank))
        total = self.target.psum_banks
        if block_bytes is not None:
            # An automatically allocated block tensor: "the block dimension describes how many (P, F)
            # logical tiles this tensor has, but does not reflect the number of physical tiles being
            # allocated" (AWS, nki.compiler.psum.alloc). The compiler maps the blocks onto the
            # physical tiles their lifetimes need (AWS's attention tutorial declares 32 to 256 blocks
            # and keeps one or two live); here such a tensor reserves one block's banks, and its
            # blocks keep separate values (an allocation without conflicts: whether the blocks that
            # are live at once fit in PSUM is not checked).
            banks = max(1, -(-block_bytes // bank))
        if banks > total:
            raise NKIError(instruction, f"PSUM capacity exceeded: a {shape} tile needs {banks} bank(s) of "
                           f"{bank} bytes per partition, more than the {total} there are ({self.target.name})",
                           "PSUM holds 8 tiles of up to [128, 512] float32")
        return banks

    def check_capacity(self):
        """After the program ran: its tiles' lifetimes against SBUF's and PSUM's size (liveness.py)."""
        self.peak_sbuf, self.peak_psum_banks = _check_lifetimes(self.lifetimes, self.target)

    # ------------------------------------------------------------------ trace
    def record(self, op, engine, writes, reads, cost, flops=0, nbytes=0, matmul_dtype=None):
        ins = Instr()
        ins.index = len(self.trace)
        ins.op = op
        ins.engine = engine
        ins.location = kernel_location()
        ins.cost = cost
        ins.writes = [(t.alloc.id, box(t)) for t in writes]
        ins.reads = [(t.alloc.id, box(t)) for t in reads]
        operands = (*writes, *reads)
        ins.shapes = tuple([t.data.shape for t in operands])
        ins.dtypes = tuple([t.alloc.dtype_name for t in operands])
        ins.buffers = tuple([t.alloc.buffer.name for t in operands])
        ins.nbytes = nbytes
        ins.flops = flops
        ins.matmul_dtype = matmul_dtype
        ins.after = ()  # trace indices it must wait for besides its data (NkiInstruction.depends_on)
        self.lifetimes.used([t.alloc.id for t in operands])
        self.trace.append(ins)
        self.last_record = ins
        return ins


def _default_buffer():
    from .tensor import sbuf

    return sbuf


class ParDim(int):
    """`nl.par_dim(n)`: marks the partition axis of a shape; axes before it are block axes."""

    def __repr__(self):
        return f"nl.par_dim({int(self)})"


def _partition_axis(shape) -> int:
    """Where the partition axis of an on-chip shape is: the nl.par_dim axis, else 0."""
    if isinstance(shape, (tuple, list)):
        for axis, s in enumerate(shape):
            if isinstance(s, ParDim):
                return axis
    return 0


def _check_shape(shape, instruction):
    if isinstance(shape, int):
        shape = (shape,)
    try:
        shape = tuple(int(s) for s in shape)
    except TypeError:
        raise NKIError(instruction, f"shape must be a tuple of ints, got {shape!r}") from None
    if any(s <= 0 for s in shape):
        raise NKIError(instruction, f"shape {shape} has a non-positive dimension")
    return shape


def current(instruction: str = "nki") -> Run:
    run = getattr(_LOCAL, "run", None)
    if run is None:
        raise NKIError(instruction, "NKI language calls are only valid inside a running kernel",
                       "decorate the function with @nki.jit and call it (or nki.simulate(kernel)(...))")
    return run


def active() -> "Run | None":
    return getattr(_LOCAL, "run", None)


def set_run(run):
    previous = getattr(_LOCAL, "run", None)
    _LOCAL.run = run
    return previous
