"""Command-line flags generated from a settings model, so that a flag exists exactly where a setting does."""

from __future__ import annotations

import argparse
import types
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ByteSize

SCALARS = (bool, int, float, str, Path)


def add_settings_flags(parser: argparse.ArgumentParser, model: type[BaseModel]) -> tuple[str, ...]:
    """Add one flag per scalar field of `model` (nested sections stay YAML and env only); return their dests.

    `max_num_seqs` becomes `--max-num-seqs`; a switch that is on by default becomes `--no-...` without an
    `enable_` prefix (`enable_prefix_caching` is `--no-prefix-caching`). Every flag defaults to None, so a
    flag left out does not override the YAML file or the environment.
    """
    dests = []
    for name, field in model.model_fields.items():
        kind = _without_none(field.annotation)
        help_text = field.description
        if kind is bool and field.default is True:
            flag = "--no-" + name.removeprefix("enable_").replace("_", "-")
            parser.add_argument(flag, dest=name, action="store_false", default=None,
                                help=help_text and f"do not {help_text}")
        elif kind is bool:
            parser.add_argument(f"--{name.replace('_', '-')}", action="store_true", default=None, help=help_text)
        elif get_origin(kind) is Literal:
            parser.add_argument(f"--{name.replace('_', '-')}", choices=list(get_args(kind)), help=help_text)
        elif isinstance(kind, type) and issubclass(kind, SCALARS):
            # pydantic parses a size such as 512MiB from its text
            value_type = str if issubclass(kind, ByteSize) else kind
            parser.add_argument(f"--{name.replace('_', '-')}", type=value_type, help=help_text)
        else:
            continue  # a nested section
        dests.append(name)
    return tuple(dests)


def _without_none(annotation: Any) -> Any:
    if get_origin(annotation) in (Union, types.UnionType):
        return next(arg for arg in get_args(annotation) if arg is not type(None))
    return annotation
