"""The training options of `vse train` and `vse sweep`, generated from ``pipeline.core.config.TrainConfig``.

Every field of TrainConfig becomes one click option (its help, type, choices and flag spelling
come from the field), plus the loss flags (``config.LOSS_FLAGS``) and ``--loss-option``. The
click options have no default of their own: an option not given stays unset, so TrainConfig
holds every default and ``--resume`` knows what the user set. Torch-free, like --help.
"""

from __future__ import annotations

import json
import typing
from dataclasses import fields

import click
from click.core import ParameterSource

from cli.dataset_root import csv_option_decorators, root_option
from pipeline.core import config as options
from pipeline.core.config import LOSS_FLAGS, UNSET, TrainConfig
from pipeline.core.registry import READERS

_CLICK_TYPES = {int: click.INT, float: click.FLOAT, str: click.STRING}


class TrainOption(click.Option):
    """An option of TrainConfig: default None here, shown in --help from the dataclass."""

    def __init__(self, *args, config_class=TrainConfig, **kwargs):
        super().__init__(*args, **kwargs)
        self.config_class = config_class

    def get_help_extra(self, ctx):
        extra = super().get_help_extra(ctx)
        default = self.config_class.default(self.name)
        if self.is_bool_flag and self.secondary_opts and default is None:
            extra.pop("default", None)  # decided by the config (its help says how)
        elif self.is_bool_flag and self.secondary_opts:
            extra["default"] = (self.opts if default else self.secondary_opts)[0].lstrip("-")
        elif default not in (None, "") and not self.is_bool_flag:
            extra["default"] = str(default)
        return extra


def _shared_options() -> dict:
    """TrainConfig fields whose option is the one other commands share (cli/dataset_root.py)."""
    shared = {"root": root_option(prefix="--rc: ")}
    shared.update(zip(READERS.option_names(), csv_option_decorators()))
    return shared


def _value_type(name: str, config_class):
    """The click type of a field: its choices, a path, or the (non-None) annotation."""
    facts = options.info(name, config_class)
    if facts.choices is not None:
        return click.Choice([str(c) for c in facts.choices])
    if facts.path:
        return click.Path(dir_okay=facts.path == "folder", file_okay=facts.path == "file")
    hint = typing.get_type_hints(config_class)[name]
    kinds = [t for t in typing.get_args(hint) or (hint,) if t is not type(None)]
    return _CLICK_TYPES.get(kinds[0], click.STRING)


def field_option(name: str, config_class=TrainConfig):
    """The click option of field ``name``."""
    facts = options.info(name, config_class)
    kwargs = {"cls": TrainOption, "config_class": config_class, "default": None, "help": facts.help or None}
    if facts.metavar:
        kwargs["metavar"] = facts.metavar
    hint = typing.get_type_hints(config_class)[name]
    if hint in (bool, bool | None):  # bool | None: unset until the config resolves it (--cpu-amp)
        if facts.flag_value is not UNSET:  # one-way flag (--no-img-norm)
            return click.option(facts.flag, name, flag_value=facts.flag_value, **kwargs)
        if facts.flag:  # --amp/--no-amp
            return click.option(facts.flag, name, is_flag=True, **kwargs)
        return click.option(options.flag_name(name), name, is_flag=True, **kwargs)
    return click.option(facts.flag or options.flag_name(name), name, type=_value_type(name, config_class),
                        **kwargs)


def parse_key_values(ctx, param, values):
    parsed = {}
    for item in values:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}")
        try:
            parsed[key] = json.loads(raw)
        except ValueError:
            parsed[key] = raw
    return parsed


def train_options(exclude=(), config_class=TrainConfig):
    """Decorator: every option of ``config_class`` (but ``exclude``), the loss flags and
    --loss-option. The command receives them all as keyword arguments (``loss_option`` for
    --loss-option)."""
    shared = _shared_options()
    decorators = []
    for f in fields(config_class):
        facts = options.info(f.name, config_class)
        if f.name in exclude or not facts.cli:
            continue
        decorators.append(shared[f.name] if facts.shared else field_option(f.name, config_class))
        if f.name == "margin":  # the loss's own options follow the loss
            decorators += [click.option(options.flag_name(flag), flag, type=_CLICK_TYPES[spec.type],
                                        default=None, help=spec.help) for flag, spec in LOSS_FLAGS.items()]
            decorators.append(click.option("--loss-option", "loss_option", multiple=True,
                                           callback=parse_key_values,
                                           help="Any other loss option, KEY=VALUE (JSON value), repeatable."))
        if f.name == "network":
            decorators.append(click.option("--network-option", "network_option", multiple=True,
                                           callback=parse_key_values,
                                           help="An option of the network, NAME=VALUE (JSON value), "
                                                "repeatable."))

    def decorate(command):
        for decorator in reversed(decorators):
            command = decorator(command)
        return command

    return decorate


def given_values(ctx, values: dict, loss_option: dict, base: dict | None = None) -> tuple[dict, set]:
    """The options the user set: ``base`` (a config file's) updated by the flags given on the
    command line (flags win), with the loss flags and --loss-option merged into loss_options,
    and --network-option into network_options. Returns (TrainConfig values, the names of the
    options set)."""
    network_option = values.pop("network_option", None) or {}
    values = {name: value for name, value in values.items()
              if ctx.get_parameter_source(name) not in (ParameterSource.DEFAULT, ParameterSource.DEFAULT_MAP)}
    if network_option:
        values["network_options"] = {**((base or {}).get("network_options") or {}), **network_option}
    merged = {**(base or {}), **values}
    given = {"loss_options" if name in LOSS_FLAGS else name for name in merged}
    loss_options = dict(merged.pop("loss_options", None) or {})
    for flag, spec in LOSS_FLAGS.items():
        value = merged.pop(flag, None)
        if value is not None:
            loss_options[spec.key] = value
    loss_options.update(loss_option or {})
    if loss_options or loss_option:
        merged["loss_options"] = loss_options
        given.add("loss_options")
    return merged, given


def options_markdown(config_class=TrainConfig) -> str:
    """docs/OPTIONS.md: every training option, from the fields (``python -m cli.train_options``
    writes it; a test checks the committed file equals this)."""
    hints = typing.get_type_hints(config_class)
    command = click.command()(train_options(config_class=config_class)(lambda **kwargs: None))
    helps = {param.name: param.help or "" for param in command.params}  # as --help shows them
    lines = ["# Training options (`vse train`, `vse sweep`)", "",
             "Generated from `pipeline/core/config.py` by `python -m cli.train_options > docs/OPTIONS.md`;",
             "do not edit by hand. *Resume*: `--resume` may change it. *Identity*: part of what a run",
             "computes (runs differing only in other options and the seed are one row of `vse report`).",
             "*Older runs*: the value a run written before the option existed used.", "",
             "| option | type | default | resume | identity | older runs | what it does |",
             "|:---|:---|:---|:---:|:---:|:---|:---|"]
    for f in fields(config_class):
        facts = options.info(f.name, config_class)
        hint = hints[f.name]
        kinds = [t.__name__ for t in typing.get_args(hint) or (hint,) if t is not type(None)]
        kind = " \\| ".join(map(str, facts.choices)) if facts.choices else " or ".join(kinds)
        if facts.minimum is not None:
            kind += f", {'≥' if facts.inclusive else '>'} {facts.minimum}"
        flag = facts.flag or options.flag_name(f.name) if facts.cli else f"`{f.name}` (config files)"
        flag = f"`{flag}`" if facts.cli else flag
        help_text = helps.get(f.name, facts.help)
        before = "" if facts.before is UNSET else f"`{facts.before!r}`"
        default = f"`{config_class.default(f.name)!r}`"
        if facts.cli and facts.flag_value is not UNSET:  # a one-way flag: off unless given
            default = f"off (`{f.name}: {config_class.default(f.name)!r}`)"
        lines.append(f"| {flag} | {kind} | {default} | "
                     f"{'yes' if facts.resume else ''} | {'yes' if facts.identity else ''} | {before} | "
                     f"{help_text.replace('|', '/')} |")
    lines += ["", "Loss flags (each sets one entry of `loss_options`):", "",
              "| flag | loss option | type | what it does |", "|:---|:---|:---|:---|"]
    lines += [f"| `{options.flag_name(flag)}` | `{spec.key}` | {spec.type.__name__} | {spec.help} |"
              for flag, spec in LOSS_FLAGS.items()]
    lines += ["| `--loss-option KEY=VALUE` | any | JSON | any other option of the loss, repeatable |", ""]
    lines += ["`--network-option NAME=VALUE` (JSON value, repeatable) sets one entry of `network_options`.",
              ""]
    return "\n".join(lines)


if __name__ == "__main__":
    print(options_markdown(), end="")
