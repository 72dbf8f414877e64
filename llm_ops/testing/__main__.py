"""``python -m llm_ops.testing [--port N]``: serve the local simulator until interrupted."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json

from ._server import PRESETS, SimulatorConfig, serve


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m llm_ops.testing",
        description="Serve the llm-ops local OpenAI-compatible simulator on 127.0.0.1.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765, help="0 picks a free port")
    parser.add_argument("--latency", type=float, default=None, help="seconds per answer")
    parser.add_argument(
        "--preset", choices=sorted(PRESETS), help="a server with a knee (see PRESETS)"
    )
    parser.add_argument("--config", default="{}", help="SimulatorConfig fields as JSON")
    args = parser.parse_args(argv)
    fields = dict(PRESETS[args.preset]) if args.preset else {}
    config = SimulatorConfig.from_json(fields | json.loads(args.config))
    if args.latency is not None:
        config.latency = args.latency
    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(serve(config, host=args.host, port=args.port))
    except OSError as exc:
        raise SystemExit(f"cannot serve on {args.host}:{args.port}: {exc.strerror}") from None


if __name__ == "__main__":
    main()
