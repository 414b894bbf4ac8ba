"""Flags generated from a settings model: names, types, choices, switches, and what stays YAML-only."""

from __future__ import annotations

import argparse
from typing import Literal

import pytest
from pydantic import BaseModel, ByteSize, Field

from tidegate.settings_flags import add_settings_flags


class Section(BaseModel):
    rate: float = 1.0


class Example(BaseModel):
    max_num_seqs: int = Field(default=4, description="most requests in one step")
    mode: Literal["fast", "slow"] = "fast"
    limit: int | None = None
    memory: ByteSize = ByteSize(1024)
    enable_cache: bool = Field(default=True, description="keep the cache")
    verbose: bool = False
    section: Section = Field(default_factory=Section)


@pytest.fixture
def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    parser.set_defaults(fields=add_settings_flags(parser, Example))
    return parser


def test_every_scalar_field_gets_a_flag_and_nested_sections_do_not(parser: argparse.ArgumentParser) -> None:
    assert parser.parse_args([]).fields == ("max_num_seqs", "mode", "limit", "memory", "enable_cache", "verbose")
    with pytest.raises(SystemExit):
        parser.parse_args(["--section", "x"])


def test_flags_left_out_are_none_so_they_override_nothing(parser: argparse.ArgumentParser) -> None:
    args = vars(parser.parse_args([]))
    assert all(args[name] is None for name in args["fields"])


def test_values_are_typed_and_choices_enforced(parser: argparse.ArgumentParser) -> None:
    args = parser.parse_args(["--max-num-seqs", "8", "--mode", "slow", "--limit", "3", "--memory", "2MiB"])
    assert (args.max_num_seqs, args.mode, args.limit, args.memory) == (8, "slow", 3, "2MiB")
    with pytest.raises(SystemExit):
        parser.parse_args(["--mode", "medium"])


def test_a_switch_on_by_default_is_a_no_flag_without_its_enable_prefix(parser: argparse.ArgumentParser) -> None:
    args = parser.parse_args(["--no-cache", "--verbose"])
    assert args.enable_cache is False and args.verbose is True
    assert "do not keep the cache" in parser.format_help()
