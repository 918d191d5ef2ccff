"""The ``conductor`` command: ask the Conductor a question, serve the Conductor API, run the
sandbox worker server, promote / roll back a registered Conductor version, compute what
fixed strategies score in the sandbox, or check what a run needs (``preflight``).

This module reads the command line (and is Kedro's project CLI extension); what each
command does is in ``commands.py``."""

from __future__ import annotations

import argparse
import logging
import sys

import click

from conductor_pipeline.offline import apply_offline_defaults

apply_offline_defaults()  # before anything imports litellm or transformers


def _use_project_logging_file() -> None:
    """Kedro configures logging when it is first imported (just below), from
    ``KEDRO_LOGGING_CONFIG`` or else its default, which logs to stdout and announces the file
    it used: a ``conductor ask --json`` run with only the virtual environment activated
    printed that line above its JSON. The project's file (the Makefile's) keeps the line
    out; ``configure_cli_logging`` then sends the rest to stderr. Under ``kedro run``, which
    loads this module as a plugin, Kedro is already configured and nothing changes."""
    if "kedro.framework.project" in sys.modules:
        return
    from conductor_pipeline.notebook_logging import LOGGING_FILE, use_project_logging
    from conductor_pipeline.paths import find_project_root

    try:
        root = find_project_root()
    except RuntimeError:  # an installed package run outside any project: Kedro's default
        return
    if (root / LOGGING_FILE).is_file():
        use_project_logging(root)


_use_project_logging_file()

from conductor_pipeline.commands import (  # noqa: E402
    SPLITS,
    cmd_ask,
    cmd_preflight,
    cmd_promote,
    cmd_sandbox,
    cmd_serve,
    cmd_strategies,
)
from conductor_pipeline.run_errors import run  # noqa: E402
from conductor_pipeline.stderr_logging import StderrHandler  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="conductor", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    commands = parser.add_subparsers(dest="command", required=True)

    ask = commands.add_parser(
        "ask", help="orchestrate one question with the configured Conductor and pool"
    )
    ask.add_argument("question", nargs="?", help="the question (or use --sample)")
    ask.add_argument(
        "--sample", action="store_true", help="take a question from the prepared test split"
    )
    ask.add_argument("--seed", type=int, default=0, help="which sample question (with --sample)")
    ask.add_argument("--json", action="store_true", help="print the full record as JSON")
    ask.add_argument(
        "--env", default=None, help="configuration environment, e.g. gpu (default: local over base)"
    )
    ask.add_argument("--max-rounds", type=int, default=None, help="extra recursion rounds")
    ask.add_argument(
        "--adapter",
        default=None,
        help="LoRA folder, models:/conductor@<alias> or models:/conductor/<version> "
        "(default: conductor.policy.adapter, the champion); `none` asks the untrained base policy",
    )
    ask.set_defaults(handler=cmd_ask)

    serve = commands.add_parser(
        "serve", help="serve the Conductor API (OpenAI-compatible) over the configured pool"
    )
    serve.add_argument("--host", default=None, help="default: serving.host (127.0.0.1)")
    serve.add_argument(
        "--port", type=int, default=None, help="default: serving.port (8700); 0 picks a free one"
    )
    serve.add_argument("--env", default=None, help="configuration environment, e.g. gpu")
    choice = serve.add_mutually_exclusive_group()
    choice.add_argument(
        "--model",
        default=None,
        help="registry model: conductor@<alias> or conductor/<version> "
        "(default: conductor.policy.adapter, base policy while nothing is registered)",
    )
    choice.add_argument("--adapter", default=None, help="a LoRA adapter folder to serve")
    serve.add_argument(
        "--policy-server",
        choices=("local", "vllm"),
        default=None,
        help="local: the configured policy in this process; vllm: launch vLLM (GPU)",
    )
    serve.add_argument(
        "--max-concurrency", type=int, default=None, help="requests at once; more get 429"
    )
    serve.set_defaults(handler=cmd_serve)

    promote = commands.add_parser(
        "promote",
        help="gate a registered version against the champion with recorded figures, or roll back",
    )
    which = promote.add_mutually_exclusive_group()
    which.add_argument(
        "--version", default=None, help="registry version to gate (default: the challenger)"
    )
    which.add_argument(
        "--rollback",
        action="store_true",
        help="give champion back to the version the current champion replaced",
    )
    promote.add_argument("--env", default=None, help="configuration environment (the gates)")
    promote.add_argument("--json", action="store_true", help="print the decision as JSON")
    promote.set_defaults(handler=cmd_promote)

    sandbox = commands.add_parser("sandbox", help="run the sandbox worker server in the foreground")
    sandbox.add_argument("--host", default="127.0.0.1")
    sandbox.add_argument("--port", type=int, default=8600)
    sandbox.add_argument("--env", default=None)
    sandbox.add_argument("--latency-scale", type=float, default=None)
    sandbox.set_defaults(handler=cmd_sandbox)

    preflight = commands.add_parser(
        "preflight",
        help="check every worker endpoint, key and dataset a run of the profile needs "
        "(what `kedro run` checks first with preflight.enabled)",
    )
    preflight.add_argument("--env", default=None, help="configuration environment, e.g. gpu")
    preflight.add_argument(
        "--checks",
        nargs="+",
        choices=("workers", "data_prep", "benchmarks"),
        default=None,
        help="only these checks (default: all)",
    )
    preflight.add_argument(
        "--hosted-completion",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="one short paid request per hosted worker (default: preflight.hosted_completion)",
    )
    preflight.set_defaults(handler=cmd_preflight)

    strategies = commands.add_parser(
        "strategies",
        help="expected accuracy and cost of fixed strategies over the sandbox's simulated "
        "workers: exact from their profiles, and a Monte-Carlo run of the real workers",
    )
    strategies.add_argument("--split", choices=SPLITS, default="test", help="default: test")
    strategies.add_argument(
        "--seeds",
        type=int,
        default=20,
        help="Monte-Carlo server seeds (default 20); 0 skips the Monte-Carlo (and the cost)",
    )
    strategies.add_argument(
        "--profiles",
        default=None,
        help="sandbox profile file (default: conf/base/sandbox_workers.yml)",
    )
    strategies.add_argument(
        "--unsolved-share",
        type=float,
        default=None,
        help="also each strategy's accuracy on the questions the reference worker gets wrong "
        "and right, mixed at this share of wrong ones (training.curriculum.unsolved_share)",
    )
    strategies.add_argument(
        "--reference-worker",
        default=None,
        help="with --unsolved-share: the worker asked alone (default: the checker, the "
        "strongest worker; training.curriculum.reference_worker)",
    )
    strategies.add_argument("--json", action="store_true", help="print the table as JSON")
    strategies.set_defaults(handler=cmd_strategies)
    return parser


@click.group(name="conductor_pipeline")
def cli() -> None:
    """Kedro loads ``<package>/cli.py`` as a project CLI extension and needs this group; its
    one command replaces ``kedro run`` (checks first, one-line errors: ``run_errors.py``)."""


# `kedro run`, and `python -m conductor_pipeline` (Kedro's find_run_command reads `run` here)
cli.add_command(run)


def configure_cli_logging(verbose: bool) -> None:
    """Logs go to stderr, whatever handlers an imported library installed, so that stdout
    carries only the answer or the ``--json`` record."""
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
        handlers=[StderrHandler()],
        force=True,
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_cli_logging(args.verbose)
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
