"""``llm-ops serve``: the local OpenAI-compatible simulator of :mod:`llm_ops.testing`, on
127.0.0.1, until interrupted."""

from __future__ import annotations

import argparse
import asyncio
import contextlib

from ..testing import DEFAULT_PORT, FAULT_KINDS, SimulatorConfig, serve
from ._parser import Commands, command


def add_commands(commands: Commands) -> None:
    serve_parser = command(
        commands,
        "serve",
        run_server,
        summary="serve the local OpenAI-compatible simulator",
        description="Serve the local simulator (for development, demos and tests, not a model) "
        "on 127.0.0.1.",
    )
    serve_parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    serve_parser.add_argument("--latency", type=float, default=0.0, help="seconds per answer")
    serve_parser.add_argument("--rpm", type=int, help="requests per minute before 429s")
    serve_parser.add_argument("--tpm", type=int, help="tokens per minute before 429s")
    serve_parser.add_argument(
        "--fault-rate",
        type=float,
        default=0.0,
        help=f"share of attempts failing as one of {', '.join(FAULT_KINDS)}",
    )
    serve_parser.add_argument(
        "--hang-rate", type=float, default=0.0, help="share of attempts that never answer"
    )


def run_server(args: argparse.Namespace) -> int:
    config = SimulatorConfig(
        latency=args.latency,
        rpm=args.rpm,
        tpm=args.tpm,
        fault_rate=args.fault_rate,
        hang_rate=args.hang_rate,
    )
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(config, port=args.port))
    return 0
