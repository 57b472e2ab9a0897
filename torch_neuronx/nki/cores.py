"""The programs of one launch as concurrent NeuronCores: what `nisa.core_barrier` and `nisa.sendrecv`
need (LNC 2: the two physical cores of a logical NeuronCore run the kernel at the same time and
synchronize).

Each program of a grid runs in its own thread, and the threads take turns: exactly one runs at a
time, and a program gives the turn away only where it must wait for another core (a barrier the
others have not reached, a sendrecv whose data has not been sent). The turn then goes to the next
program in grid order that can run. So a launch is deterministic (the same interleaving every
run), shared state (the trace, shared_hbm tensors) needs no locks, and a kernel without barriers
runs exactly as a sequential loop over its programs would: program 0 to its end, then program 1.

A deadlock (every unfinished program waits, e.g. at a core_barrier one core never reaches) is
detected at the moment it happens, not by a timeout: the launch raises an NKIError naming what each
core waits for and which cores finished. An error in one program stops the others and is raised
from the launch.

A program's rank (its core in core_barrier / sendrecv) is its linear index in the grid: with
`kernel[2]` (nki-library's `cpu_simulate(kernel)[2]`, LNC 2) it is `nl.program_id(0)`.
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

    def __init__(self, n: int):
        self.n = n
        self._cond = threading.Condition()
        self._turn = 0
        self._state = ["ready"] * n      # ready | waiting | done
        self._waiting = [None] * n        # (predicate, what, location) of a waiting program
        self._stop = None                 # the exception that stops the launch
        # core_barrier: how many barriers over a core set each program has reached.
        self.arrivals = collections.defaultdict(lambda: [0] * n)
        # sendrecv: FIFO of tiles in flight per (sender, receiver, pipe_id).
        self.mailboxes = collections.defaultdict(collections.deque)

    # ---------------------------------------------------------------- running the programs
    def run(self, bodies) -> list:
        """Run `bodies[i]()` as program i (its own thread when there are several); their results.
        The first error of a program (or a deadlock) is raised here."""
        results = [None] * self.n
        if self.n == 1:
            results[0] = bodies[0]()
            return results

        def program(i):
            try:
                with self._cond:
                    self._cond.wait_for(lambda: self._turn == i or self._stop is not None)
                    if self._stop is not None:
                        return
                results[i] = bodies[i]()
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
                self._pass_turn(i)

        threads = [threading.Thread(target=program, args=(i,), name=f"nki-core-{i}", daemon=True)
                   for i in range(self.n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if self._stop is not None:
            raise self._stop
        return results

    def _pass_turn(self, i: int) -> None:
        """Give the turn to the next program after i (grid order, wrapping) that can run; with
        none and some still waiting, the programs deadlocked. Called holding the lock."""
        for k in range(1, self.n + 1):
            j = (i + k) % self.n
            if self._state[j] == "ready" or (self._state[j] == "waiting" and self._waiting[j][0]()):
                self._turn = j
                self._cond.notify_all()
                return
        if any(s == "waiting" for s in self._state):
            self._stop = self._deadlock()
        self._cond.notify_all()

    def _deadlock(self) -> NKIError:
        lines = []
        first = None
        for j in range(self.n):
            if self._state[j] == "waiting":
                _, what, location = self._waiting[j]
                first = first or (what, location)
                lines.append(f"core {j} waits at {what} ({location})")
            else:
                lines.append(f"core {j} finished the kernel")
        what, location = first
        return NKIError(what.split("(")[0], "deadlock: every core that has not finished waits for another: "
                        + "; ".join(lines),
                        "make every core listed in a core_barrier reach it the same number of times, and "
                        "pair each sendrecv with one on the core it sends to / receives from", location=location)

    def wait(self, rank: int, predicate, what: str) -> None:
        """Block program `rank` until `predicate()` holds, letting the other programs run."""
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
            self._pass_turn(rank)
            self._cond.wait_for(lambda: self._turn == rank and self._state[rank] == "waiting"
                                and predicate() or self._stop is not None)
            if self._stop is not None:
                raise _Abort()
            self._state[rank] = "ready"
            self._waiting[rank] = None
