"""Checks of option values, the one place of each (torch-free): the training config checks its fields
with them, and every part (a loss, a pool, a network, a reader; built-in or a user's own) its options.

``is_int`` / ``is_number`` say what a value is (a bool is neither: ``True`` is an int to Python,
never to an option); ``finite``, ``positive``, ``within``, ``finite_list`` and ``int_at_least``
return the checked value or raise one line naming the option (``ValueError`` unless told another
error class, e.g. ``VseError``). ``as_type`` is the one type check of an option against its
annotation (``TrainConfig``'s fields and parts' options alike).

A part declares its options once, next to its code, as a frozen dataclass whose fields are the
options (``declare``: the default, a help line, a range, choices), e.g. a loss's::

    class Options(VseLoss.Options):
        tau: float = declare(0.1, "The temperature.", above=0)

``declared_options(Options, given, owner="loss csn")`` builds it from the given values, refusing in
one line naming the part and the option an unknown name (listing the known ones), a wrong type, a
value out of range or choices."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import numbers
import types
import typing
from dataclasses import dataclass


def is_int(value) -> bool:
    """An integer (any ``numbers.Integral``: numpy's too), not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_number(value) -> bool:
    """A real number (ints included), not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def is_int_at_least(value, low: int) -> bool:
    return is_int(value) and value >= low


def finite(value, name: str, *, error: type[Exception] = ValueError) -> float:
    """``value`` as a float; ``error`` unless it is a finite number."""
    if not is_number(value) or not math.isfinite(value):
        raise error(f"{name} must be a finite number, got {value!r}")
    return float(value)


def positive(value, name: str) -> float:
    """A finite number > 0, as a float."""
    value = finite(value, name)
    if value <= 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")
    return value


def within(value, name: str, low=None, high=None) -> float:
    """A finite number in [low, high] (either bound may be None: open on that side), as a float."""
    value = finite(value, name)
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = (f"in [{low:g}, {high:g}]" if low is not None and high is not None
                  else f">= {low:g}" if low is not None else f"<= {high:g}")
        raise ValueError(f"{name} must be {bounds}, got {value!r}")
    return value


def finite_list(values, name: str, low=None, high=None) -> list[float]:
    """A list (or tuple) of finite numbers, each in [low, high] (``within``)."""
    if not isinstance(values, (list, tuple)):
        raise ValueError(f"{name} must be a list of numbers, got {values!r}")
    return [within(value, name, low, high) for value in values]


def int_at_least(value, name: str, low: int, *, or_none: bool = False):
    """An integer >= ``low`` (or None, with ``or_none``), returned as given."""
    if (or_none and value is None) or is_int_at_least(value, low):
        return value
    raise ValueError(f"{name} must be an integer >= {low}{' or null' if or_none else ''}, got {value!r}")


# ---------------------------------------------------------------------------- types
KINDS = {bool: "true or false", int: "an integer", float: "a number", str: "text",
         dict: "a mapping of option names to values", list: "a list", tuple: "a list"}


def allowed_types(hint) -> tuple:
    """The types an annotation allows (``int | None`` → (int, NoneType)); a generic by its origin
    (``list[float]`` → list), an unknown annotation as ``object`` (anything)."""
    allowed = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    return tuple(typing.get_origin(t) or t if isinstance(t, type) or typing.get_origin(t) else object
                 for t in allowed)


def _of_kind(name: str, value, kind, error, text_numbers: bool):
    """(True, value as ``kind``) or (False, None); a float that is not finite raises ``error``."""
    if kind is float and text_numbers and isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return False, None
    if kind is bool:
        return isinstance(value, bool), value
    if kind is int:
        return (True, int(value)) if is_int(value) else (False, None)
    if kind is float:
        return (True, finite(float(value), name, error=error)) if is_number(value) else (False, None)
    if kind is dict:
        return isinstance(value, dict) and all(isinstance(key, str) for key in value), value
    return isinstance(value, kind), value


def as_type(name: str, value, hint, *, error: type[Exception] = ValueError, text_numbers: bool = False):
    """``value`` as option ``name`` of annotation ``hint`` (``int``, ``float | None``, ``str | list``,
    ...), or ``error`` saying what it must be: the one type check of an option, a training option's
    (``core.config.TrainConfig``) and a part's (``declared_options``) alike. A bool is neither an int
    nor a number; an int given for a float becomes a float, which must be finite; ``text_numbers``:
    text such as '1e-3' (YAML 1.1 reads it as text) is a float too."""
    allowed = allowed_types(hint)
    optional = type(None) in allowed
    if value is None and optional:
        return None
    kinds = [kind for kind in allowed if kind is not type(None)]
    for kind in kinds:
        ok, converted = _of_kind(name, value, kind, error, text_numbers)
        if ok:
            return converted
    words = dict.fromkeys(KINDS.get(kind, getattr(kind, "__name__", str(kind))) for kind in kinds)
    raise error(f"{name} must be {' or '.join(words)}{' (or null)' if optional else ''}, got {value!r}")


# ---------------------------------------------------------------------------- a part's options
OPTION = "vse-option"  # the key of a declared option's facts in its field's metadata


@dataclass(frozen=True)
class OptionFacts:
    """What a part's option declares besides its default and type (``declare``)."""

    help: str = ""
    low: float | None = None      # the lowest value ...
    low_open: bool = False        # ... not itself allowed (``above``)
    high: float | None = None     # the highest value ...
    high_open: bool = False       # ... not itself allowed (``below``)
    choices: tuple | None = None  # the allowed values

    def low_words(self) -> str:
        return "" if self.low is None else f"{'>' if self.low_open else '>='} {self.low:g}"

    def high_words(self) -> str:
        return "" if self.high is None else f"{'<' if self.high_open else '<='} {self.high:g}"

    def closed(self) -> bool:
        """Both bounds given, both allowed: said as one interval."""
        return self.low is not None and self.high is not None and not (self.low_open or self.high_open)

    def range_words(self) -> str:
        """'>= 0', '> 0', 'in [0, 1]', '> 0 and <= 1', or ''."""
        if self.closed():
            return f"in [{self.low:g}, {self.high:g}]"
        return " and ".join(words for words in (self.low_words(), self.high_words()) if words)

    def out_of_range(self, value) -> str:
        """The words of the bound ``value`` breaks ('>= 0'; 'in [0, 1]' for a closed range), or ''."""
        too_low = self.low is not None and (value < self.low or self.low_open and value == self.low)
        too_high = self.high is not None and (value > self.high or self.high_open and value == self.high)
        if not (too_low or too_high):
            return ""
        return self.range_words() if self.closed() else self.low_words() if too_low else self.high_words()


def declare(default, help: str = "", *, low=None, above=None, high=None, below=None,
            choices=None) -> dataclasses.Field:
    """A field of a part's options dataclass (a loss's, a pool's, a network's, a reader's ``Options``):
    its default and what ``declared_options`` checks besides its annotation: a range (``low`` /
    ``high`` inclusive, ``above`` / ``below`` exclusive) and ``choices``."""
    if (low is not None and above is not None) or (high is not None and below is not None):
        raise TypeError("give low or above, and high or below, not both")
    facts = OptionFacts(help, low if above is None else above, above is not None,
                        high if below is None else below, below is not None,
                        None if choices is None else tuple(choices))
    return dataclasses.field(default=default, metadata={OPTION: facts})


@dataclass(frozen=True)
class NoOptions:
    """The options of a part that has none."""


def option_facts(field_: dataclasses.Field) -> OptionFacts:
    return field_.metadata.get(OPTION, OptionFacts())


def options_of(cls: type, besides: tuple = ()) -> type | None:
    """The options dataclass a part's class is built from: ``cls.Options`` when it is a dataclass
    and ``cls`` takes its fields as keywords (its ``__init__`` names them, besides ``besides``, e.g. a
    pool's ``dim``, or takes ``**options``); None otherwise (an ``__init__`` of other keywords, which
    then checks what it is given)."""
    declared = getattr(cls, "Options", None)
    if not dataclasses.is_dataclass(declared):
        return None
    try:
        parameters = list(inspect.signature(cls.__init__).parameters.values())[1:]
    except (TypeError, ValueError):
        return None
    loose = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    named = {p.name for p in parameters if p.kind not in loose} - set(besides)
    return declared if not named or named == {f.name for f in dataclasses.fields(declared)} else None


@functools.lru_cache(maxsize=None)
def option_types(options_class) -> dict:
    """Each field's annotation, resolved (``from __future__ import annotations`` leaves text); one
    that does not resolve (a user's file) is taken as its default's type."""
    try:
        return typing.get_type_hints(options_class)
    except Exception:  # noqa: BLE001 - a forward reference of a user's file: fall back on the defaults
        return {f.name: (object if f.default is dataclasses.MISSING else type(f.default))
                for f in dataclasses.fields(options_class)}


def checked_option(name: str, value, hint, facts: OptionFacts | None = None):
    """``value`` as an option of annotation ``hint`` within ``facts`` (ValueError naming ``name``
    otherwise). An integer with a range says both in one message ('an integer >= 1 or null')."""
    facts = facts or OptionFacts()
    allowed = allowed_types(hint)
    optional = type(None) in allowed
    if value is None and optional:
        return None
    ranged = facts.low is not None or facts.high is not None
    if ranged and [kind for kind in allowed if kind is not type(None)] == [int]:
        if not is_int(value) or facts.out_of_range(value):
            null = " or null" if optional else ""
            raise ValueError(f"{name} must be an integer {facts.range_words()}{null}, got {value!r}")
        return int(value)
    value = as_type(name, value, hint)
    if ranged and is_number(value) and (bound := facts.out_of_range(value)):
        raise ValueError(f"{name} must be {bound}, got {value!r}")
    if facts.choices is not None and value not in facts.choices:
        raise ValueError(f"{name} must be one of {', '.join(map(str, facts.choices))}, got {value!r}")
    return value


def declared_options(options_class, given: dict | None, owner: str, *,
                     error: type[Exception] = ValueError, spell=str):
    """The instance of ``options_class`` (a frozen dataclass of ``declare`` fields; None: no
    options) from ``given`` (name → value), each value checked against its field: the one check of
    a part's options, for losses, pools, networks and readers alike. ``error`` (naming ``owner``,
    e.g. "loss ncr", in one line) for an unknown name (the message lists the known ones), a wrong
    type, a value out of its range or choices, or what the class's own ``__post_init__`` refuses
    (its ValueError or TypeError). ``spell`` writes an option's name as the user gave it (a reader's:
    its flag)."""
    given = dict(given or {})
    options_class = NoOptions if options_class is None else options_class
    known = {f.name: f for f in dataclasses.fields(options_class)}
    unknown = [name for name in given if name not in known]
    if unknown:
        names = ", ".join(map(spell, sorted(unknown)))
        if not known:
            raise error(f"{owner} has no options; got {names}")
        raise error(f"{owner} has no option {names} (its options: {', '.join(map(spell, known))})")
    hints = option_types(options_class)
    checked = {}
    for name, value in given.items():
        try:
            checked[name] = checked_option(spell(name), value, hints.get(name, object),
                                           option_facts(known[name]))
        except ValueError as exc:
            raise error(f"{owner}: {exc}") from None
    try:
        return options_class(**checked)
    except (TypeError, ValueError) as exc:
        raise error(f"{owner}: {exc}") from None
