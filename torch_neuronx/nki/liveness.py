"""On-chip capacity by tile lifetime, as AWS's allocator sees it.

AWS's compiler gives an SBUF or PSUM tile its memory from the first instruction that uses it to the
last, not from the `nl.ndarray` call until the kernel's Python drops it. Kernels rely on it:
nki-library's MoE CTE keeps a dead PSUM tile bound while it allocates all 8 banks, and allocates the
next round's accumulators before the last reads of the previous round's; nki-samples'
select_and_scatter rebinds a 50 KB tile only after loading the next one.

So each program's Run keeps a `Lifetimes`: every automatically allocated on-chip tile with the clock
ticks of its first and last use (instructions that read or write it) or, for a tile no instruction
used, of its allocation and of the moment Python dropped it (the end of the program if never). One
clock counts allocations, drops and instructions. After the program has run, the live bytes (SBUF)
and banks (PSUM) are swept over that clock; the first tile that takes a buffer past the target's
capacity is the error, at its allocation's kernel line. A tile larger than the whole buffer is
refused when it is allocated (runtime.Run.allocate).

Reading a tile's value while tracing (a scalar_offset read when a view is made) is not an
instruction and does not extend its lifetime: capacity errs on the lenient side there.
"""

from __future__ import annotations

import math

from .errors import NKIError, kernel_location


class _Tile:
    __slots__ = ("kind", "amount", "allocated", "first_use", "last_use", "dropped", "location", "shape",
                 "instruction")

    def __init__(self, kind, amount, start, shape, instruction):
        self.kind = kind
        self.amount = amount
        self.allocated = start
        self.first_use = None
        self.last_use = None
        self.dropped = None
        self.location = kernel_location()
        self.shape = shape
        self.instruction = instruction

    def start(self) -> int:
        return self.first_use if self.first_use is not None else self.allocated

    def end(self) -> float:
        if self.last_use is not None:
            return self.last_use
        return self.dropped if self.dropped is not None else math.inf


class Lifetimes:
    """The on-chip tiles of one program, their lifetimes, and the capacity check over them."""

    def __init__(self):
        self.clock = 0
        self.tiles: dict[int, _Tile] = {}

    def allocated(self, alloc_id, kind, amount, shape, instruction) -> None:
        self.clock += 1
        self.tiles[alloc_id] = _Tile(kind, amount, self.clock, shape, instruction)

    def dropped(self, alloc_id) -> None:
        tile = self.tiles.get(alloc_id)
        if tile is not None and tile.dropped is None:
            self.clock += 1
            tile.dropped = self.clock

    def used(self, alloc_ids) -> None:
        """An instruction read or wrote these allocations."""
        self.clock += 1
        for alloc_id in alloc_ids:
            tile = self.tiles.get(alloc_id)
            if tile is not None:
                if tile.first_use is None:
                    tile.first_use = self.clock
                tile.last_use = self.clock

    def sweep(self, kind, capacity):
        """(peak, the tile whose start first exceeds capacity or None, the other tiles live then)."""
        events = []
        for tile in self.tiles.values():
            if tile.kind == kind:
                events.append((tile.start(), 1, id(tile), tile))
                events.append((tile.end(), 0, id(tile), tile))
        events.sort(key=lambda e: (e[0], -e[1]))
        live, peak, alive = 0, 0, {}
        for _, adding, key, tile in events:
            if adding:
                if live + tile.amount > capacity:
                    return max(peak, live + tile.amount), tile, list(alive.values())
                alive[key] = tile
                live += tile.amount
            else:
                alive.pop(key, None)
                live -= tile.amount
            peak = max(peak, live)
        return peak, None, []


def _holders(tiles) -> str:
    """Where the live tiles were allocated, the biggest holders first (at most four lines)."""
    by_line: dict[str, list] = {}
    for tile in tiles:
        by_line.setdefault(tile.location, []).append(tile.amount)
    ranked = sorted(by_line.items(), key=lambda kv: -sum(kv[1]))
    parts = [f"{len(amounts)} x {amounts[0]} at {where}" for where, amounts in ranked[:4]]
    return "; ".join(parts) + ("; ..." if len(ranked) > 4 else "")


def check(lifetimes: Lifetimes, target) -> tuple[int, int]:
    """Raise the capacity error of the first tile past SBUF's or PSUM's size; else the peaks
    (SBUF bytes per partition, PSUM banks)."""
    buffers = (  # kind, capacity, the unit of a tile's need, of what is in use, of the holders' amounts, hint
        ("sbuf", target.sbuf_bytes_per_partition, "bytes per partition", "", "bytes per partition",
         "use smaller tiles, or finish with a tile before allocating the next"),
        ("psum", target.psum_banks, f"bank(s) of {target.psum_bank_bytes} bytes per partition", " banks", "banks",
         "PSUM holds 8 tiles of up to [128, 512] float32; evict results before allocating more"),
    )
    peaks = []
    for kind, capacity, unit, in_use, held, hint in buffers:
        peak, over, alive = lifetimes.sweep(kind, capacity)
        if over is not None:
            live = sum(t.amount for t in alive)
            raise NKIError(over.instruction, f"{kind.upper()} capacity exceeded: a {over.shape} tile needs "
                           f"{over.amount} {unit}, {live} of {capacity}{in_use} are in use by tiles still used "
                           f"later ({target.name}; {held} of the live tiles: {_holders(alive)})", hint,
                           location=over.location)
        peaks.append(peak)
    return peaks[0], peaks[1]
