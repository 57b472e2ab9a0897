"""pytest plugin that lets AWS's TorchNeuron test suite run against this package.

Loaded with `-p plugin` by run.py; never by this project's own tests.

- Stubs for AWS-only modules: a test file that imports a module of AWS's own
  build (`torch_neuronx.python_ops`, `torch_neuronx.nki_kernel`, ...) still
  collects; the stub's names are falsy and raise when called. scope.py counts the
  tests that use those names as private, so a stub never decides a public result.
  The finder sits last on sys.meta_path: a module that exists (this package's
  `torch_neuronx.utils`, the `neuronxcc.nki` alias) is always the real one.
- A per-test time limit (AWS_SUITE_TIMEOUT seconds, default 120) without
  pytest-timeout: SIGALRM in the main thread.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import signal
import sys
import types

import pytest

_STUBBED_ROOTS = ("torch_neuronx", "neuronxcc", "libneuronxla", "torch_mlir")


class _Stub:
    """A name from an AWS-only module: falsy, and an error to call."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Stub(f"{self._name}.{attr}")

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"aws_suite: {self._name} is AWS-private (stubbed by the harness)")

    def __bool__(self):
        return False

    def __iter__(self):
        return iter(())

    def __mro_entries__(self, bases):
        return (object,)


# Public facts AWS's tests read from AWS-only modules (scope.PUBLIC_NAMES).
_FACTS = {"torch_neuronx.nki_kernel": {"IS_NKI_V2_AVAILABLE": True}}


class _StubModule(types.ModuleType):
    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        if attr in _FACTS.get(self.__name__, {}):
            return _FACTS[self.__name__][attr]
        return _Stub(f"{self.__name__}.{attr}")


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname.split(".")[0] not in _STUBBED_ROOTS or fullname in ("torch_neuronx",):
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        module = _StubModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


sys.meta_path.append(_StubFinder())


class HarnessTimeout(Exception):
    pass


def _on_alarm(signum, frame):
    raise HarnessTimeout(f"aws_suite: test ran past {os.environ.get('AWS_SUITE_TIMEOUT', '120')} s")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    limit = int(os.environ.get("AWS_SUITE_TIMEOUT", "120"))
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    signal.alarm(limit)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
