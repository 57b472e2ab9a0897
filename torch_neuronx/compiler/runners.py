"""The runners: what the backend hands AOTAutograd for each graph, boxed
callables, which AOTAutograd's result cache (compiler/aot_cache.py) pickles by
this module's path (renaming it turns older entries into misses, reported and
replaced)."""

from __future__ import annotations

import pickle
from typing import TYPE_CHECKING

from torch._inductor.output_code import OutputCode

if TYPE_CHECKING:
    from torch_neuronx.compiler.executable import CompiledGraph


class BoxedOutput(OutputCode):
    """What the backend hands AOTAutograd for one graph: a callable taking the
    list of inputs (boxed). An OutputCode, the type AOTAutograd's result cache
    (compiler/aot_cache.py) stores; this base class holds graphs that are not
    stored there (run eagerly, or split around custom ops)."""

    def __init__(self, fn):
        self.fn = fn
        # An instance attribute: wrappers made with functools.wraps (Dynamo's
        # disable() around the backward) copy it, so they are called boxed too.
        self._boxed_call = True

    def __call__(self, args):
        return self.fn(args)

    def __getstate__(self):
        raise pickle.PicklingError("this graph runs outside a single executable; it is not cached")

    def prepare_for_serialization(self) -> None:
        pass

    def post_compile(self, example_inputs, constants, graph_kwargs) -> None:
        pass  # executables are loaded on the first call


class GraphRunner(BoxedOutput):
    """A graph compiled to one executable; it pickles as its CompiledGraph."""

    def __init__(self, compiled: CompiledGraph):
        super().__init__(compiled)
        self.compiled_graph = compiled

    def __getstate__(self):
        return {"compiled_graph": self.compiled_graph}

    def __setstate__(self, state):
        self.__init__(state["compiled_graph"])
