"""`nl.NKIObject`: the base of the classes a kernel builds and passes around at trace time.

AWS's language guide ("Class Support"): a class used in a kernel inherits from NKIObject, and "in
NKI all classes are similar to Python data classes": with or without `@dataclass` the compiler gives
it, when the class does not write them, an `__init__` taking every field as an optional argument
(a field without a default defaults to None) that then calls `__post_init__`. nki-library relies on
it: its MoE configs (`DimensionSizes(T=..., H=...)`, `Configs(...)`) are plain annotated classes, and
moe_tkg builds an `@dataclass` while leaving out one of its fields.

The simulator runs the kernel's Python as written, so the base adds only that initializer and one
thing nki-library's attention_cte relies on (AWS does not document it; its kernels construct them so):
in a subclass, plain class attributes without an annotation (`section_idx = None`) are fields too,
after the annotated ones, their values the defaults. No state (`__slots__ = ()`): subclasses keep
their `__dict__`, dataclass equality and hashing their own.
"""

from __future__ import annotations

import dataclasses

_MISSING = dataclasses.MISSING


def _fields(cls) -> list[tuple[str, object, object, bool]]:
    """(name, default, default_factory, init) per field, in dataclass order: a dataclass's own field
    records where `@dataclass` made it one, else the annotations of the NKIObject classes of its MRO
    (base first) with their class attributes as defaults."""
    if dataclasses.is_dataclass(cls):
        return [(f.name, f.default, f.default_factory, f.init) for f in dataclasses.fields(cls)]
    names: dict[str, None] = {}
    for klass in reversed(cls.__mro__):
        if issubclass(klass, NKIObject):
            names.update(dict.fromkeys(klass.__dict__.get("__annotations__", {})))
    return [(name, getattr(cls, name, _MISSING), _MISSING, True) for name in names]


def _default_init(self, *args, **kwargs):
    """The initializer AWS's compiler writes for a class that has none: every field an optional
    argument (positional in field order, or by name), None where the class gives no default, then
    `__post_init__`. Values are set with object.__setattr__ so frozen dataclasses build too."""
    cls = type(self)
    fields = _fields(cls)
    params = [f for f in fields if f[3]]
    if len(args) > len(params):
        raise TypeError(f"{cls.__name__}() takes at most {len(params)} positional arguments "
                        f"({len(args)} given)")
    unknown = set(kwargs) - {f[0] for f in params}
    if unknown:
        raise TypeError(f"{cls.__name__}() got an unexpected keyword argument {sorted(unknown)[0]!r}")
    given = dict(zip((f[0] for f in params), args))
    twice = set(given) & set(kwargs)
    if twice:
        raise TypeError(f"{cls.__name__}() got multiple values for argument {sorted(twice)[0]!r}")
    given.update(kwargs)
    for name, default, factory, _ in fields:
        if name in given:
            value = given[name]
        elif factory is not _MISSING:
            value = factory()
        elif default is not _MISSING:
            value = default
        else:
            value = None
        object.__setattr__(self, name, value)
    post_init = getattr(self, "__post_init__", None)
    if post_init is not None:
        post_init()


_default_init._nki_default = True


def _has_own_init(cls) -> bool:
    """Whether an NKIObject class of cls's MRO writes its own __init__ (not the default one)."""
    for klass in cls.__mro__:
        if klass is NKIObject:
            return False
        init = klass.__dict__.get("__init__")
        if init is not None and not getattr(init, "_nki_default", False):
            return True
    return False


class NKIObject:
    """`nl.NKIObject` (see the module docstring)."""

    __slots__ = ()

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        _annotate_plain_attributes(cls)
        # Installed in the class's own namespace, so a later @dataclass keeps it (dataclass adds
        # __init__ only where the class has none): with or without the decorator, one initializer.
        if not _has_own_init(cls):
            cls.__init__ = _default_init


def _annotate_plain_attributes(cls) -> None:
    own = cls.__dict__.get("__annotations__")
    if own is None:
        own = {}
        try:
            cls.__annotations__ = own
        except (AttributeError, TypeError):
            return
    for key, value in list(cls.__dict__.items()):
        if (key.startswith("_") or key in own or callable(value)
                or isinstance(value, (staticmethod, classmethod, property))):
            continue
        own[key] = "typing.Any"
