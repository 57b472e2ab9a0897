"""The programs of one launch as concurrent NeuronCores: what `nisa.core_barrier` and `nisa.sendrecv`
need (LNC 2: the two physical cores of a logical NeuronCore run the kernel at the same time and
synchronize).

The programs take turns: exactly one runs at a time, and a program gives the turn away only where
it must wait for another core (a barrier the others have not reached, a sendrecv whose data has not
been sent). The turn then goes to the next program in grid order that can run. A waiting program
keeps its place on its thread's stack, so a program that starts while another waits gets a thread
of its own; otherwise a thread whose program finished runs the next one (a grid without barriers
runs in the calling thread, one program after another). So a launch is deterministic (the same
interleaving every run), shared state (the trace, shared_hbm tensors) needs no locks, and a kernel
without barriers runs exactly as a sequential loop over its programs would.

A deadlock (every unfinished program waits, e.g. at a core_barrier one core never reaches) is
detected at the moment it happens, not by a timeout: the launch raises an NKIError naming what each
core waits for and which cores finished. An error in one program stops the others and is raised
from the launch.

A program's core (in core_barrier / sendrecv) is its linear index in the grid: with `kernel[2]`
(nki-library's `cpu_simulate(kernel)[2]`, LNC 2) it is `nl.program_id(0)`. `nki.multi_rank_simulate`
runs several ranks' launches in one scheduler: program `gid` is core `gid % lnc` of rank
`gid // lnc`, and the ranks' cores meet in `nki.collectives` calls (`exchange`).
"""

from __future__ import annotations

import collections
import threading

from .errors import NKIError, kernel_location


class _Abort(BaseException):
    """Raised inside a waiting program when the launch stops (another program failed or the
    programs deadlocked); BaseException so that a kernel's `except Exception` does not catch it."""


class Cores:
    """The scheduler of one launch's programs (see the module docstring)."""

    def __init__(self, n: int, lnc: int | None = None, world_size: int = 1):
        self.n = n
        self.lnc = n if lnc is None else lnc  # programs (cores) per rank
        self.world_size = world_size
        self._cond = threading.Condition()
        self._turn = 0
        self._state = ["ready"] * n      # new (not started) | ready (running) | waiting | done
        self._waiting = [None] * n        # (predicate, what, location) of a waiting program
        self._stop = None                 # the exception that stops the launch
        # core_barrier: per (rank, core set), how many barriers each core has reached.
        self.arrivals = collections.defaultdict(lambda: [0] * self.lnc)
        # sendrecv: FIFO of tiles in flight per (rank, sender, receiver, pipe_id).
        self.mailboxes = collections.defaultdict(collections.deque)
        # nki.collectives: per (core, group), how many collectives each rank has issued, and what
        # each rank contributed to the k-th one.
        self.issued = collections.defaultdict(int)
        self.slots = collections.defaultdict(dict)

    def gid(self, world_rank: int, core: int) -> int:
        return world_rank * self.lnc + core

    def label(self, gid: int) -> str:
        core = f"core {gid % self.lnc}"
        return core if self.world_size == 1 else f"rank {gid // self.lnc} {core}"

    def exchange(self, gid: int, world_rank: int, core: int, group: tuple, what: str, contribution) -> dict:
        """Rendezvous of the ranks of `group` (on the same core index) at their next collective
        over that group: post this rank's contribution, wait for every member's, return them all
        (rank -> contribution). The members must issue the same collective (`what`)."""
        key = (core, group)
        seq = self.issued[(world_rank,) + key]
        self.issued[(world_rank,) + key] = seq + 1
        slot = self.slots[key + (seq,)]
        slot[world_rank] = (what, contribution)
        self.wait(gid, lambda: all(r in slot for r in group),
                  f"{what} number {seq + 1} over ranks {list(group)} (waiting for rank(s) "
                  f"{[r for r in group if r not in slot]})")
        kinds = {r: slot[r][0] for r in group}
        if len(set(kinds.values())) > 1:
            raise NKIError(what, f"the ranks of replica group {list(group)} issued different collectives as their "
                           f"collective number {seq + 1} over it: " + ", ".join(f"rank {r}: {k}" for r, k in kinds.items()),
                           "issue the same collectives in the same order on every rank of a group")
        return {r: slot[r][1] for r in group}

    # ---------------------------------------------------------------- running the programs
    def run(self, bodies) -> list:
        """Run `bodies[i]()` as program i; their results. The first error of a program (or a
        deadlock) is raised here.

        Threads are made only where programs overlap: the calling thread runs program 0, and a
        thread whose program finishes runs the next program that has not started yet. A new thread
        starts a program only when the running one must wait (its stack holds its place). So a grid
        without barriers runs its programs one after another in the calling thread."""
        self._results = [None] * self.n
        if self.n == 1:
            self._results[0] = bodies[0]()
            return self._results
        self._bodies = bodies
        self._threads = []
        self._state = ["new"] * self.n
        self._chain(0)
        with self._cond:
            self._cond.wait_for(lambda: self._stop is not None or all(x == "done" for x in self._state))
            threads = list(self._threads)
        for t in threads:
            t.join()
        if self._stop is not None:
            raise self._stop
        return self._results

    def _chain(self, i) -> None:
        """Run program i, then whatever program this thread is handed next (see _pass_turn)."""
        while i is not None:
            try:
                self._results[i] = self._bodies[i]()
            except _Abort:
                return
            except BaseException as exc:  # noqa: BLE001 - re-raised by the launching thread
                with self._cond:
                    if self._stop is None:
                        self._stop = exc
                    self._cond.notify_all()
                return
            with self._cond:
                self._state[i] = "done"
                i = self._pass_turn(i, free=True)

    def _pass_turn(self, i: int, free: bool):
        """Give the turn to the next program after i (grid order, wrapping) that can run: a waiting
        one whose condition holds, or one not started yet, which this thread runs itself if its own
        program finished (`free`, the program is returned), else a new thread runs. With none and
        some still waiting, the programs deadlocked. Called holding the lock."""
        for k in range(1, self.n + 1):
            j = (i + k) % self.n
            state = self._state[j]
            if state == "new":
                self._turn = j
                self._state[j] = "ready"
                if free:
                    return j
                thread = threading.Thread(target=self._chain, args=(j,), name=f"nki-{self.label(j)}", daemon=True)
                self._threads.append(thread)
                thread.start()
                return None
            if state == "waiting" and self._waiting[j][0]():
                self._turn = j
                self._cond.notify_all()
                return None
        if any(x == "waiting" for x in self._state):
            self._stop = self._deadlock()
        self._cond.notify_all()
        return None

    def _deadlock(self) -> NKIError:
        lines = []
        first = None
        for j in range(self.n):
            if self._state[j] == "waiting":
                _, what, location = self._waiting[j]
                first = first or (what, location)
                lines.append(f"{self.label(j)} waits at {what} ({location})")
            else:
                lines.append(f"{self.label(j)} finished the kernel")
        what, location = first
        return NKIError(what.split("(")[0], "deadlock: every core that has not finished waits for another: "
                        + "; ".join(lines),
                        "make every core listed in a core_barrier reach it the same number of times, "
                        "pair each sendrecv with one on the core it sends to / receives from, and issue each "
                        "collective on every rank of its replica group", location=location)

    def wait(self, rank: int, predicate, what: str) -> None:
        """Block program `rank` (a gid) until `predicate()` holds, letting the other programs run."""
        if predicate():
            return
        location = kernel_location()
        if self.n == 1:
            self._waiting[rank] = (predicate, what, location)
            self._state[rank] = "waiting"
            raise self._deadlock()
        with self._cond:
            self._state[rank] = "waiting"
            self._waiting[rank] = (predicate, what, location)
            self._pass_turn(rank, free=False)
            self._cond.wait_for(lambda: self._turn == rank and self._state[rank] == "waiting"
                                and predicate() or self._stop is not None)
            if self._stop is not None:
                raise _Abort()
            self._state[rank] = "ready"
            self._waiting[rank] = None
