"""Random ops of a compiled graph drawn on the host, from the CPU generator.

TorchNeuron takes each native_dropout out of a compiled graph: its mask becomes
a graph input that PyTorch's CPU kernel draws from the CPU generator at every
call, so a compiled model drops what the same model drops eagerly, and on the
CPU, under the same seed. This module does that for dropout and for every
other random op whose numbers depend only on shapes, dtypes and constants
(``rand``, ``randn``, ``randint``, ``randperm``, ``x.uniform_()``,
``x.normal_()``, ``x.bernoulli_(p)``, ...): each becomes a graph input drawn in
graph order by the CPU op itself, so compiled numbers equal eager ones.

Random ops whose parameters the graph computes (``x.bernoulli_(probabilities)``,
``multinomial``, ``poisson``, ``normal`` with tensor mean or std, ``rrelu``) and random ops inside control-flow bodies stay in the graph, keyed
by the neuron generator (compiler/executable.py)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.fx

aten = torch.ops.aten

# The overloads drawn on the host. Their only tensor argument, if any, gives
# the result's shape, strides and dtype; its values are never read.
_HOST_DRAWN = {
    aten.rand.default, aten.randn.default, aten.rand_like.default, aten.randn_like.default,
    aten.randint.default, aten.randint.low, aten.randint_like.default, aten.randint_like.low_dtype,
    aten.randperm.default, aten.uniform.default, aten.normal_functional.default,
    aten.normal.float_float, aten.bernoulli.p, aten.exponential.default, aten.cauchy.default,
    aten.log_normal.default, aten.geometric.default, aten.random.default, aten.random.to,
    getattr(aten.random, "from"), aten.native_dropout.default,
}


@dataclass(frozen=True)
class _Like:
    """A tensor argument, by what the CPU op reads of it."""

    shape: tuple
    stride: tuple
    dtype: torch.dtype

    def empty(self) -> torch.Tensor:
        return torch.empty_strided(self.shape, self.stride, dtype=self.dtype)


@dataclass(frozen=True)
class Draw:
    """One random op taken out of the graph: called on the CPU at each run."""

    op: str  # "rand.default"
    args: tuple
    kwargs: dict
    output: int | None  # the element of a tuple result the graph receives (dropout's mask)

    def sample(self, device: torch.device) -> torch.Tensor:
        packet, overload = self.op.split(".")
        op = getattr(getattr(aten, packet), overload)
        args = [a.empty() if isinstance(a, _Like) else a for a in self.args]
        kwargs = {k: (v.empty() if isinstance(v, _Like) else v) for k, v in self.kwargs.items()}
        if "device" in kwargs:
            kwargs["device"] = torch.device("cpu")
        result = op(*args, **kwargs)
        return (result if self.output is None else result[self.output]).to(device)


def _template(value):
    if isinstance(value, torch.fx.Node):
        fake = value.meta["val"]
        return _Like(tuple(fake.shape), tuple(fake.stride()), fake.dtype)
    return value


def _drawable(node: torch.fx.Node) -> bool:
    if node.op != "call_function" or node.target not in _HOST_DRAWN:
        return False
    if node.target is aten.native_dropout.default and node.args[2] is False:
        return False  # evaluation: no draw, the lowering passes the input through
    arguments = [*node.args, *node.kwargs.values()]
    return all(not isinstance(a, torch.fx.Node) or isinstance(a.meta.get("val"), torch.Tensor)
               for a in arguments) and "val" in node.meta


def split(gm: torch.fx.GraphModule) -> list[Draw]:
    """Replaces the graph's host-drawn random ops (top level only: a body of a
    control-flow op may run any number of times) by placeholders appended
    after the graph's inputs, in graph order; returns what to draw for them."""
    graph = gm.graph
    draws: list[Draw] = []
    last_input = [n for n in graph.nodes if n.op == "placeholder"][-1:]
    for node in [n for n in graph.nodes if _drawable(n)]:
        dropout = node.target is aten.native_dropout.default
        draw = Draw(str(node.target).removeprefix("aten."), tuple(_template(a) for a in node.args),
                    {k: _template(v) for k, v in node.kwargs.items()}, 1 if dropout else None)
        anchor = last_input[-1] if last_input else next(iter(graph.nodes))
        insert = graph.inserting_after(anchor) if last_input else graph.inserting_before(anchor)
        with insert:
            placeholder = graph.placeholder(f"host_random_{len(draws)}")
        placeholder.meta["val"] = node.meta["val"][1] if dropout else node.meta["val"]
        last_input = [placeholder]
        if dropout:
            _replace_dropout(graph, node, placeholder)
        else:
            node.replace_all_uses_with(placeholder)
            graph.erase_node(node)
        draws.append(draw)
    if draws:
        graph.lint()
        gm.recompile()
    return draws


def _replace_dropout(graph: torch.fx.Graph, node: torch.fx.Node, mask: torch.fx.Node) -> None:
    """(input * mask) * scale, in the CPU kernel's order, so the values match too."""
    x, p = node.args[0], float(node.args[1])
    scale = 0.0 if p == 1.0 else 1.0 / (1.0 - p)
    with graph.inserting_before(node):
        masked = graph.call_function(aten.mul.Tensor, (x, mask))
        masked.meta["val"] = node.meta["val"][0]
        out = graph.call_function(aten.mul.Tensor, (masked, scale))
        out.meta["val"] = node.meta["val"][0]
    for user in list(node.users):  # getitem(node, 0) / getitem(node, 1)
        user.replace_all_uses_with(out if user.args[1] == 0 else mask)
        graph.erase_node(user)
    graph.erase_node(node)


def with_draws(draws: list[Draw], args: list, device: torch.device | None = None) -> list:
    """The graph's inputs: `args`, then its draws, made in graph order before the graph
    runs (the order eager code draws them from the CPU generator)."""
    if not draws:
        return args
    if device is None:
        device = next((a.device for a in args if isinstance(a, torch.Tensor) and a.device.type == "neuron"),
                      torch.device("neuron", torch.neuron.current_device()))
    return [*args, *(draw.sample(device) for draw in draws)]
