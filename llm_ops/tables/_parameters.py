"""A job on files as parameters a scheduler stores: the table's, then a field per setting."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from pydantic import Field

from .._parameters import SettingsModel
from ..exceptions import ConfigError, Words
from ._files import media_folders
from ._settings import table_of_settings
from ._table import Table


class TableSettings(SettingsModel):
    """A job on files as a flow's parameters: the input and output, the prompt and model, how
    the work is split; decorated with :func:`llm_ops.with_settings`, a field per setting too.

    As a scheduler stores parameters, the API key and credential headers are never among
    them: ``api_key_secret`` and ``header_secrets`` name the secrets that hold them, which a
    subclass reads in :meth:`secret` (a Prefect flow: its Secret blocks).

    Examples
    --------
    >>> from llm_ops import with_settings
    >>> from llm_ops.tables import TableSettings
    >>> @with_settings(defaults={"model": "gpt-4o-mini"})
    ... class Enrich(TableSettings):
    ...     pass
    >>> Enrich(input="in.parquet", output="out.parquet", prompt="{text}").settings()
    {'model': 'gpt-4o-mini', 'progress': False}
    """

    metavars: ClassVar[Mapping[str, str]] = {
        "input": "FILE",
        "output": "FILE",
        "prompt": "TEMPLATE",
        "model": "MODEL",
        "cert_key": "PEM",
        "api_key_secret": "SECRET",
        "header_secrets": "HEADER=SECRET",
    }

    input: str = Field(description="Parquet path or glob")
    output: str = Field(description="Parquet file to write")
    prompt: str = Field(description="template with {column} references")
    model: str | list[str] = Field(
        description="a model; again for a cascade, from the cheapest to the strongest"
    )
    cert_key: str | None = Field(None, description="the cert's key, if not in the cert file")
    chunk_size: int = Field(5_000, ge=1, description="distinct requests per send-chunk task")
    rows_per_read: int = Field(100_000, ge=1, description="rows per read batch and row group")
    api_key_secret: str | None = Field(
        None, description="the secret holding the API key (default: OPENAI_API_KEY)"
    )
    header_secrets: dict[str, str] | None = Field(
        None,
        description="headers whose values are secrets, header name to secret name, e.g. "
        "{'api-key': 'azure-openai-key'} for Azure OpenAI",
    )

    def secret(self, name: str) -> str:
        """The value of the secret ``name``, as the scheduler keeps it."""
        raise ConfigError(
            f"{type(self).__name__} reads no secrets: define its secret() to read {name!r}"
        )

    @classmethod
    def words(cls, **otherwise: str) -> Words:
        """As :meth:`SettingsModel.words`, the API key and headers named by their secrets'."""
        return super().words(api_key="api_key_secret", headers="header_secrets", **otherwise)

    def settings(self) -> dict[str, Any]:
        """The job's settings (see :data:`llm_ops.SETTINGS`), its model among them, for
        :func:`table_of_settings`: with images or documents, the input's folder is where the
        files they name may be (:func:`media_folders`); progress is a scheduler's to show."""
        settings = {**super().settings(), "model": self.model, "progress": False}
        if self.api_key_secret:
            settings["api_key"] = self.secret(self.api_key_secret)
        if self.header_secrets:
            secrets = {name: self.secret(held) for name, held in self.header_secrets.items()}
            settings["headers"] = {**(self.headers or {}), **secrets}
        if self.cert is not None and self.cert_key is not None:
            settings["cert"] = (self.cert, self.cert_key)
        folders = media_folders(self.input, settings)
        return settings if folders is None else {**settings, "media_folders": folders}

    def table(self) -> Table:
        """The job, on a client shared in the process (see :func:`table_of_settings`); raises
        a :class:`~llm_ops.ConfigError` for what can be checked before sending."""
        return table_of_settings(
            self.settings(),
            self.input,
            self.output,
            prompt=self.prompt,
            rows_per_read=self.rows_per_read,
            chunk_size=self.chunk_size,
        )
