"""Settings named in an error message as the command line's flags: ``--api-key-env``, not
``api_key=`` (see :func:`llm_ops.exceptions.setting`)."""

from __future__ import annotations

import shlex

from .._parameters import flag_of
from ..exceptions import Words

# The settings whose flag gives them another way than their value: the API key and the
# credential headers by the environment variable that holds them, so they stay out of the
# shell's history.
_GIVEN_OTHERWISE: dict[str, tuple[str, str]] = {
    "api_key": ("--api-key-env", "VARIABLE"),
    "headers": ("--header-env", "NAME=VARIABLE"),
}


class FlagWords(Words):
    """The command line's words: a setting is its flag, setting it is the flag and a value."""

    def name(self, setting: str) -> str:
        if setting in _GIVEN_OTHERWISE:
            return _GIVEN_OTHERWISE[setting][0]
        declared = flag_of(setting)
        return "--" + setting.replace("_", "-") if declared is None else declared.flag_name

    def set_to(self, setting: str, value: str | None) -> str:
        if value:
            return f"{self.name(setting)} {shlex.quote(value)}"
        if setting in _GIVEN_OTHERWISE:
            return " ".join(_GIVEN_OTHERWISE[setting])
        declared = flag_of(setting)
        metavar = declared.metavar if declared is not None and declared.metavar else "..."
        return f"{self.name(setting)} {metavar}"


FLAG_WORDS = FlagWords()
