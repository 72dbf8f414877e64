"""A job on files from flat settings, as a command line or a scheduler's flow gives them, on a
client shared within the process."""

from __future__ import annotations

import atexit
import os
from collections.abc import Mapping
from typing import Any, cast

from .._client import Client, shared_key
from .._options import CLIENT_OPTIONS, SETTINGS, ClientOptions, options_from_settings
from ._table import Table

_clients: dict[str, Client] = {}


def table_of_settings(
    settings: Mapping[str, Any],
    source: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    prompt: str,
    rows_per_read: int = 100_000,
    chunk_size: int = 5_000,
) -> Table:
    """A :class:`Table` from flat settings (see :data:`llm_ops.SETTINGS`; ``model`` among
    them), as :func:`llm_ops.options_from_settings` reads them.

    Its client is shared by every table the process makes with the same client settings (the
    endpoint, the cache, the limits), so what one task learned of the endpoint (how many
    requests it absorbs, its rate limits) holds in the next; it is closed when the process
    exits. Clients are told apart as the expressions' are (:func:`~llm_ops._client.shared_key`:
    a hash of their options and environment, which no copy keeps).

    Parameters
    ----------
    settings
        The job's flat settings by name, ``model`` among them; a setting of ``None`` is left
        out.
    source, out, prompt, rows_per_read, chunk_size
        As :class:`Table` takes them.

    Returns
    -------
    Table
        Checked against the input's columns; nothing is sent yet.
    """
    given = {name: value for name, value in settings.items() if value is not None}
    of_client = {
        name: given.pop(name)
        for name in list(given)
        if (SETTINGS[name][0] if name in SETTINGS else name) in CLIENT_OPTIONS
    }
    made = options_from_settings(of_client)
    key = shared_key(cast(ClientOptions, made))
    if key not in _clients:
        client = _clients[key] = Client(**made)
        atexit.register(client.close)
    options = options_from_settings(given)
    return Table(
        _clients[key],
        source,
        out,
        prompt=prompt,
        model=options.pop("model"),
        rows_per_read=rows_per_read,
        chunk_size=chunk_size,
        **options,
    )
