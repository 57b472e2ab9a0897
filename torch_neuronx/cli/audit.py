"""``torch-neuronx audit [options] -- COMMAND ...``: runs the user's command
unchanged, with recording switched on in every process that loads the device,
then reports what would change on Trainium and what a unit of work would cost.

The command runs as a child process with TORCH_NEURONX_AUDIT_DIR pointing at a
fresh directory: each process that imports torch (and so torch_neuronx) records
itself there (torch_neuronx/audit/recorder.py), so `python script.py`,
`python -m pkg`, `accelerate launch` and `torchrun --nproc-per-node N` all work.
The audit's exit code is the command's own; a command that fails or is
interrupted (Ctrl-C) still gets its report, built from what was recorded.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

from torch_neuronx.cli import CommandError

HELP = "run a training or inference command and report what Trainium needs changed and what it will cost"


def add_arguments(parser) -> None:
    parser.add_argument("--instance", action="append", metavar="NAME",
                        help="target instance profile (repeatable); default: trn2.3xlarge and trn3.3xlarge")
    parser.add_argument("--price", action="append", default=[], metavar="INSTANCE=USD_PER_HOUR",
                        help="hourly price of an instance, overriding the built-in table (repeatable)")
    parser.add_argument("--baseline", metavar="NAME:SECONDS_PER_STEP:USD_PER_HOUR",
                        help="what you run today, e.g. g6e.xlarge:0.42:1.861")
    parser.add_argument("--units-per-step", type=float, metavar="N",
                        help="units of work per step (default: detected tokens for the HF Trainer and generate)")
    parser.add_argument("--unit", default=None, metavar="NAME",
                        help="name of the unit of work (default: tokens when detected, else steps)")
    parser.add_argument("--json", metavar="FILE", help="write the report as JSON (schema: docs/tools.md)")
    parser.add_argument("--html", metavar="FILE", help="write the report as one self-contained HTML file")
    parser.add_argument("--quiet", action="store_true", help="no terminal summary")
    parser.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND ...",
                        help="the command to run: a script (train.py ...) or any command line")


def run(args) -> int:
    from torch_neuronx.audit import report as report_module

    options = report_module.Options.from_args(args)  # bad --price/--baseline fail before the run
    command = _command_line(args.command[1:] if args.command[:1] == ["--"] else args.command)
    with tempfile.TemporaryDirectory(prefix="torch-neuronx-audit-") as directory:
        started = time.time()
        exit_code, interrupted = _run_recorded(command, directory)
        records = _read_records(directory)
    if not records:
        raise CommandError(
            f"the command exited with code {exit_code} before any process loaded the neuron "
            "device, so there is nothing to report: check that it imports torch and runs "
            f"(command: {' '.join(command)})")
    report = report_module.build(records, options, command=command, exit_code=exit_code,
                                 interrupted=interrupted, wall_s=time.time() - started)
    _write_outputs(report, args)
    return exit_code


def _command_line(command: list[str]) -> list[str]:
    """A bare script (train.py) runs with this interpreter; anything else as written."""
    if not command:
        raise CommandError("no command to audit: give it after `--`, e.g. "
                           "torch-neuronx audit -- python train.py")
    if command and command[0].endswith(".py"):
        return [sys.executable] + command
    return command


def _run_recorded(command: list[str], directory: str) -> tuple[int, bool]:
    """Runs the command with recording on; returns (exit code, interrupted).

    Ctrl-C reaches the command (the terminal signals the whole foreground
    process group); the audit itself keeps waiting for the command to finish
    writing its records, then reports."""
    from torch_neuronx import config

    # The compiler's counters feed the report: on in the audited processes, whatever the shell says.
    env = config.child_environment(TORCH_NEURONX_AUDIT_DIR=directory, TORCH_NEURONX_METRICS_ENABLED="1")
    interrupted = threading.Event()
    previous = signal.signal(signal.SIGINT, lambda *_: interrupted.set()) \
        if threading.current_thread() is threading.main_thread() else None
    try:
        try:
            child = subprocess.Popen(command, env=env)
        except OSError as error:
            raise CommandError(f"cannot run {command[0]!r}: {error.strerror}") from None
        progress = _Progress(directory) if sys.stderr.isatty() else None
        while True:
            try:
                code = child.wait(timeout=0.5)
                break
            except subprocess.TimeoutExpired:
                if progress:
                    progress.show()
        if progress:
            progress.clear()
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
    if code < 0:  # killed by a signal: the shell's convention
        interrupted.set() if -code == signal.SIGINT else None
        code = 128 - code
    return code, interrupted.is_set() or code == 130


class _Progress:
    """One line on stderr while the command runs: elapsed, steps, ops, fallbacks."""

    def __init__(self, directory: str):
        self.directory = directory
        self.start = time.time()

    def show(self) -> None:
        steps = calls = fallbacks = 0
        for name in os.listdir(self.directory):
            if name.startswith("progress-") and name.endswith(".json"):
                try:
                    with open(os.path.join(self.directory, name)) as f:
                        state = json.load(f)
                except (OSError, ValueError):
                    continue  # being replaced right now
                steps = max(steps, state["steps"])
                calls += state["calls"]
                fallbacks = max(fallbacks, state["fallback_ops"])
        line = (f"audit: {time.time() - self.start:6.1f} s  steps {steps}  ops {calls}"
                f"  fallback ops {fallbacks}")
        sys.stderr.write("\r" + line + "\x1b[K")
        sys.stderr.flush()

    def clear(self) -> None:
        sys.stderr.write("\r\x1b[K")
        sys.stderr.flush()


def _read_records(directory: str) -> list[dict]:
    records = []
    for name in sorted(os.listdir(directory)):
        if name.startswith("record-") and name.endswith(".json"):
            with open(os.path.join(directory, name)) as f:
                records.append(json.load(f))
    return sorted(records, key=lambda r: (r["rank"], r["pid"]))


def _write_outputs(report: dict, args) -> None:
    from torch_neuronx.audit import terminal

    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    if args.html:
        from torch_neuronx.audit import html

        html.write(report, args.html)
    if not args.quiet:
        sys.stdout.flush()
        print(terminal.render(report), file=sys.stderr if args.json == "-" else sys.stdout)
