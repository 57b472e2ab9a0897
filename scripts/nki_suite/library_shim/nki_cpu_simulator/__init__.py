"""Stand-in for AWS's `nki_cpu_simulator` package, which nki-library's simulation mode imports
(test/utils/simulation_setup.py): `nki_cpu_simulator.nki` and its submodules resolve to
torch_neuronx.nki, so the library's tests run on this project's simulator, unchanged.

Harness-only (scripts/nki_suite/library.py puts this folder on PYTHONPATH); not part of the
package. Where AWS's simulator has a module that AWS's NKI reference does not document
(`nki.builtin`), the stand-in lives here, not in torch_neuronx.
"""

import os
import sys
import types

import torch_neuronx.nki as _nki
import torch_neuronx.nki.compiler as _compiler
import torch_neuronx.nki.dtypes as _dtypes
import torch_neuronx.nki.isa as _isa
import torch_neuronx.nki.isa.constants as _isa_constants
import torch_neuronx.nki.language as _language
import torch_neuronx.nki.tensor as _tensor
import torch_neuronx.nki.typing as _typing



def _view(name, target, **extra):
    """A module named `name` that reads every attribute of `target` (PEP 562 `__getattr__`), plus
    `extra`: torch_neuronx.nki has no `builtin` and its `language` no `dtypes` attribute, which
    `import nki_cpu_simulator.nki.language.dtypes as x` reads, so the shim shows views of them."""
    module = types.ModuleType(name, target.__doc__)
    module.__getattr__ = lambda attr: getattr(target, attr)
    module.__dict__.update(extra)
    sys.modules[name] = module
    return module


# `nki.builtin`: conftest sets builtins.builtin to it; no kernel of nki-library d2ad3a5 reads it
# and AWS's NKI reference does not document it: an empty namespace here.
_builtin = types.ModuleType(f"{__name__}.nki.builtin", "nki_cpu_simulator stand-in: empty (undocumented by AWS)")
sys.modules[_builtin.__name__] = _builtin
for _name, _module in {"isa.constants": _isa_constants, "language.dtypes": _dtypes}.items():
    sys.modules[f"{__name__}.nki.{_name}"] = _module
# AWS's simulator has nki.language.dtypes (conftest aliases it as nki.dtype): the dtypes module.
_language_view = _view(f"{__name__}.nki.language", _language, dtypes=_dtypes)
for _name, _module in {"compiler": _compiler, "isa": _isa, "tensor": _tensor, "typing": _typing}.items():
    sys.modules[f"{__name__}.nki.{_name}"] = _module
# AWS's simulator takes the NeuronCore generation from NKI_NC_VERSION, which the library's
# simulation_setup.py sets from the test's platform target just before `nki.cpu_simulate(...)`;
# torch_neuronx.nki reads NEURON_PLATFORM_TARGET_OVERRIDE at each launch: map one onto the other.
_GENERATIONS = {"gen3": "trn2", "gen4": "trn3"}


def cpu_simulate(kernel):
    target = _GENERATIONS.get(os.environ.get("NKI_NC_VERSION", ""))
    if target is not None:
        os.environ["NEURON_PLATFORM_TARGET_OVERRIDE"] = target
    return _nki.cpu_simulate(kernel)


nki = _view(f"{__name__}.nki", _nki, cpu_simulate=cpu_simulate, builtin=_builtin, language=_language_view, compiler=_compiler, isa=_isa,
            tensor=_tensor, typing=_typing)
