"""The ``torch-neuronx`` command: ``torch-neuronx <command> [options]``.

Installed as a console script (pyproject.toml) and runnable as
``python -m torch_neuronx``. Exit codes, for scripts (docs/tools.md):

- 0: success (also ``--help`` and ``--version``);
- 2: usage error: an unknown command or option (argparse's message and code);
- 1: runtime error: one line ``torch-neuronx: error: ...`` on stderr, no
  traceback (an invalid environment variable, an unreadable cache, ...).

A command is a module of this package with ``HELP`` (one line),
``add_arguments(parser)`` and ``run(args) -> int``; adding one is one line in
:data:`COMMANDS`. Importing this package imports only the standard library:
torch_neuronx's own ``__init__`` calls :func:`exit_if_command` while it is
half initialized.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

PROG = "torch-neuronx"

# Command name -> its module in this package, in the order --help lists them.
COMMANDS = {
    "info": "info",
    "audit": "audit",
    "ops": "ops",
}


class CommandError(Exception):
    """A failure a command reports as its one-line error (exit code 1)."""


def main(argv: list[str] | None = None) -> int:
    """Runs the command line ``argv`` (default: sys.argv[1:]); returns the exit code."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exit:  # --help / --version (0), usage errors (2): argparse printed them
        return _exit_code(exit)
    try:
        return args.run(args)
    except BrokenPipeError:  # `torch-neuronx info | head`: the reader left; nothing to report
        _silence_stdout()
        return 1
    except (CommandError, ValueError, OSError) as error:  # configuration errors are ValueErrors
        return report_error(error)


def _parser() -> argparse.ArgumentParser:
    from torch_neuronx import __version__

    parser = argparse.ArgumentParser(
        prog=PROG,
        description="TorchNeuron's command line: the emulated Trainium instance and the backend's state.",
        epilog="Exit codes: 0 success, 1 runtime error (one line on stderr), 2 usage error.")
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    commands = parser.add_subparsers(title="commands", metavar="<command>", required=True)
    for name, module_name in COMMANDS.items():
        module = importlib.import_module(f"{__name__}.{module_name}")
        command = commands.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(command)
        command.set_defaults(run=module.run)
    return parser


def _exit_code(exit: SystemExit) -> int:
    if exit.code is None:
        return 0
    return exit.code if isinstance(exit.code, int) else 1


def _silence_stdout() -> None:
    """Points stdout at /dev/null, so that flushing it at exit does not raise
    again (the recipe of Python's signal module documentation)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout is not a file (replaced in-process)
        pass


def report_error(error: BaseException) -> int:
    """Writes ``error`` as one line on stderr; returns exit code 1."""
    message = " ".join(line.strip() for line in str(error).splitlines() if line.strip())
    print(f"{PROG}: error: {message or type(error).__name__}", file=sys.stderr)
    return 1


def started_as_command() -> bool:
    """Whether this process is the torch-neuronx command: the console script,
    or ``python -m torch_neuronx`` while runpy imports the package (then
    sys.argv[0] is "-m" and sys.orig_argv names the module)."""
    if os.path.basename(sys.argv[0] if sys.argv else "") == PROG:
        return True
    if not sys.argv or sys.argv[0] != "-m":
        return False
    argv = list(getattr(sys, "orig_argv", []))
    for index, arg in enumerate(argv):
        if arg == "-m":
            return argv[index + 1:index + 2] == ["torch_neuronx"]
        if arg.startswith("-m"):
            return arg[2:] == "torch_neuronx"
    return False


def exit_if_command(error: ValueError) -> None:
    """Called by torch_neuronx's import when the configuration it reads is
    invalid (an unknown TORCH_NEURONX_INSTANCE, ...). The command's own code
    runs only after that import, so this is where the command turns the error
    into its one-line exit 1; any other program keeps the exception."""
    if started_as_command():
        raise SystemExit(report_error(error))
