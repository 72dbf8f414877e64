"""Every setting is declared once (llm_ops._settings): SETTINGS, the command line's flags, the
flow's parameters and the options page are all made from that declaration."""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
from pathlib import Path

from flows.enrich import EnrichConfig, config_of
from llm_ops import SETTINGS, with_settings
from llm_ops._options import setting_names
from llm_ops._parameters import options_page, options_tables
from llm_ops._settings import DECLARED, settings_map
from llm_ops.cli._job_arguments import add_job_arguments
from llm_ops.tables import TableSettings

ROOT = Path(__file__).resolve().parents[1]
RENAMED = tuple(
    dataclasses.replace(s, name="heat") if s.name == "temperature" else s for s in DECLARED
)


def _flags(declared: tuple) -> set[str]:
    parser = argparse.ArgumentParser()
    add_job_arguments(parser, output="the file", declared=declared)
    return {flag for action in parser._actions for flag in action.option_strings}


def _parameters(declared: tuple) -> set[str]:
    @with_settings(declared=declared)
    class Parameters(TableSettings):
        pass

    return set(Parameters.model_json_schema()["properties"])


def test_settings_is_made_from_the_declaration():
    assert settings_map(DECLARED) == SETTINGS


def test_a_setting_renamed_in_its_declaration_is_renamed_in_settings():
    renamed = settings_map(RENAMED)
    assert renamed["heat"] == ("sampling", "temperature") and "temperature" not in renamed


def test_a_setting_renamed_in_its_declaration_is_renamed_on_the_command_line():
    assert "--temperature" in _flags(DECLARED)
    assert "--heat" in _flags(RENAMED) and "--temperature" not in _flags(RENAMED)


def test_a_setting_renamed_in_its_declaration_is_renamed_in_the_flows_parameters():
    assert "temperature" in _parameters(DECLARED)
    assert "heat" in _parameters(RENAMED) and "temperature" not in _parameters(RENAMED)


def test_a_setting_renamed_in_its_declaration_is_renamed_on_the_options_page():
    assert "`temperature` (`--temperature`)" in options_tables(DECLARED)["sampling"]
    renamed = options_tables(RENAMED)["sampling"]
    assert "`heat` (`--heat`)" in renamed and "`temperature` (`--temperature`)" not in renamed


def test_the_options_page_holds_the_tables_made_from_the_declaration():
    page = (ROOT / "docs" / "reference" / "options.md").read_text()
    assert page == options_page(page), "run python -m llm_ops._options_page"


def test_every_flat_setting_is_declared_once():
    names = [s.name for s in DECLARED]
    assert len(names) == len(set(names))
    assert {s.name for s in DECLARED if s.flat} == setting_names()


def test_every_setting_a_flow_takes_is_a_parameter_of_the_flow():
    flowed = {s.parameter for s in DECLARED if s.flat and s.flow}
    assert flowed <= set(EnrichConfig.model_fields)


def test_the_flows_help_lists_every_setting_it_takes():
    done = subprocess.run(
        [sys.executable, str(ROOT / "flows" / "enrich.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    flags = {s.flag_name for s in DECLARED if s.flat and s.flow}
    assert {flag for flag in flags if flag not in done.stdout} == set()


def test_the_flows_command_line_takes_a_duration_as_written():
    assert config_of(["--max-age", "6h"]).max_age == "6h"


def test_the_flows_command_line_takes_headers_as_name_value_pairs():
    config = config_of(["--headers", "X-Tenant=acme", "--verify", "false"])
    assert (config.headers, config.verify) == ({"X-Tenant": "acme"}, False)
