"""``python -m conductor_pipeline.workers.sandbox``: run the sandbox pool server."""

from __future__ import annotations

import argparse
import faulthandler
import logging
import signal
from collections.abc import Sequence

from conductor_pipeline.workers.sandbox.server import DEFAULT_HOST, DEFAULT_PORT, serve


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m conductor_pipeline.workers.sandbox",
        description="Serve the sandbox worker pool (simulated workers and SmolLM2) over an "
        "OpenAI-compatible API.",
    )
    parser.add_argument(
        "--host", default=DEFAULT_HOST, help="address to bind (default %(default)s)"
    )
    parser.add_argument(
        "--port",
        type=int,
        default=DEFAULT_PORT,
        help="port (0 = any free one; default %(default)s)",
    )
    parser.add_argument(
        "--tasks",
        action="append",
        default=[],
        metavar="PATH",
        help="task records (.jsonl, .json or .parquet) the simulated workers can recognise; repeatable",
    )
    parser.add_argument(
        "--profiles",
        default=None,
        help="worker profile YAML (default conf/base/sandbox_workers.yml)",
    )
    parser.add_argument("--seed", type=int, default=0, help="server seed for simulated replies")
    parser.add_argument(
        "--latency-scale",
        type=float,
        default=1.0,
        help="multiplier for the simulated latencies (0 = answer at once)",
    )
    parser.add_argument(
        "--no-real-model", action="store_true", help="do not load SmolLM2 (its worker answers 503)"
    )
    parser.add_argument("--model-cache", default=None, help="folder of the converted SmolLM2 copy")
    parser.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="torch CPU threads for the real model (0 = torch's default; default %(default)s)",
    )
    parser.add_argument(
        "--real-model-concurrency",
        type=int,
        default=1,
        help="real-model batches generating at once, a thread each (default %(default)s)",
    )
    parser.add_argument("--port-file", default=None, help="write the bound port number here")
    parser.add_argument("--log-level", default="warning", help="uvicorn log level")
    parser.add_argument(
        "--parent-pid", type=int, default=None, help="shut down when this process is gone"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s: %(message)s")
    # `kill -USR1 <pid>` writes every thread's stack to the server log: what a stalled
    # server is doing, without stopping it
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    serve(
        args.host,
        args.port,
        tasks_paths=args.tasks,
        profiles_path=args.profiles,
        seed=args.seed,
        latency_scale=args.latency_scale,
        load_real_model=not args.no_real_model,
        model_cache_dir=args.model_cache,
        port_file=args.port_file,
        log_level=args.log_level,
        torch_threads=args.torch_threads or None,
        parent_pid=args.parent_pid,
        real_model_concurrency=args.real_model_concurrency,
    )


if __name__ == "__main__":
    main()
