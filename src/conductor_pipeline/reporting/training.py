"""The training report's content: curves from the MLflow metric history of the training run
(or the saved history table), worker usage over training, what the Conductor learns per
domain (who writes the answer, which workflow shapes), cost per rollout, and the warm
start's loss; the warm start check at GRPO step 1 and the multi-step attempts with the reward
they earn. The run's other files (overview, sample rollouts) are read in
:mod:`.training_files`, the opening paragraph is written in :mod:`.headlines`.

Metric names follow ``conductor_pipeline.training``: ``<stage>/<metric>`` with stage
``grpo`` or ``recursion`` (e.g. ``grpo/reward/mean``, ``grpo/rollouts/parse_rate``,
``grpo/workers/share/sim-sage``, ``grpo/domain/math/worker/sim-abacus``,
``grpo/shape/solve_check``, ``grpo/workflow/cost_usd_mean``), logged at the global
training step.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import pandas as pd

from conductor_pipeline.reporting.display import MissingInput, new_figure

# the run's files other than the history live in .training_files; the notebook reaches them
# here, as tr.<name>, with the curves
from conductor_pipeline.reporting.training_files import (  # noqa: F401  (re-exported)
    overview_table,
    read_adapter_info,
    resolve_rollout_samples,
    rollout_examples,
)

STAGES = ("grpo", "recursion")
# the training reward (correctness minus a cost penalty, floored) lies in this range
REWARD_RANGE = (0.0, 1.0)
_OTHER_PREFIXES = ("sft/", "training/")


def _is_training_metric(key: str) -> bool:
    return key.split("/", 1)[0] in STAGES or key.startswith(_OTHER_PREFIXES)


def metric_history_from_mlflow(tracking_uri: str, run_id: str) -> pd.DataFrame:
    """Long table ``key, step, value, timestamp`` of every training metric of ``run_id``."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    client = MlflowClient(tracking_uri=tracking_uri)
    try:
        run = client.get_run(run_id)
    except MlflowException as err:
        raise MissingInput(
            f"MLflow run {run_id} not found in {tracking_uri}: {str(err).splitlines()[0]}"
        ) from err
    rows = []
    for key in sorted(k for k in run.data.metrics if _is_training_metric(k)):
        for metric in client.get_metric_history(run_id, key):
            rows.append(
                {
                    "key": key,
                    "step": metric.step,
                    "value": metric.value,
                    "timestamp": metric.timestamp,
                }
            )
    return pd.DataFrame(rows, columns=["key", "step", "value", "timestamp"])


def _read_table(path: str | Path) -> pd.DataFrame:
    path = Path(path)
    if path.suffix == ".parquet":
        return pd.read_parquet(path)
    if path.suffix == ".csv":
        return pd.read_csv(path)
    if path.suffix in (".json", ".jsonl"):
        return pd.read_json(path, lines=path.suffix == ".jsonl")
    raise ValueError(f"{path}: unsupported table format (parquet, csv, json, jsonl)")


def load_history(
    tracking_uri: str | None = None,
    run_id: str | None = None,
    history_path: str | Path | None = None,
) -> tuple[pd.DataFrame, str]:
    """The per-step training metrics as a wide table (one row per step, one column per
    metric) and where they came from. The MLflow run's history comes first (it is the
    record); the saved history table is the fallback."""
    reasons = []
    if tracking_uri and run_id:
        try:
            long = metric_history_from_mlflow(tracking_uri, run_id)
        except MissingInput as missing:
            reasons.append(str(missing))
        else:
            if len(long):
                wide = (
                    long.sort_values("timestamp")
                    .pivot_table(index="step", columns="key", values="value", aggfunc="last")
                    .reset_index()
                )
                wide.columns.name = None
                return wide, f"MLflow run {run_id}"
            reasons.append(f"MLflow run {run_id} has no training metrics")
    else:
        reasons.append("no training run id was given")
    if history_path and Path(history_path).is_file():
        table = _read_table(history_path)
        if "step" in table and len(table):
            return table.sort_values("step").reset_index(drop=True), str(history_path)
        reasons.append(f"{history_path} holds no per-step rows")
    elif history_path:
        reasons.append(f"{history_path} does not exist")
    raise MissingInput("no training metrics: " + "; ".join(reasons))


def stage_steps(history: pd.DataFrame) -> pd.Series:
    """The steps at which a GRPO or recursion metric was logged (the SFT warm start logs
    ``sft/loss`` at its own steps 1 … n, which share the step column)."""
    columns = [c for c in history.columns if str(c).split("/", 1)[0] in STAGES]
    if not columns:
        return pd.Series([], dtype=float)
    return history.loc[history[columns].notna().any(axis=1), "step"]


def describe_history(history: pd.DataFrame, source: str) -> str:
    """The note under the overview: how many steps of each stage, and where from."""
    parts = [f"{len(stage_steps(history))} logged training steps"]
    if "sft/loss" in history:
        parts.append(f"{int(history['sft/loss'].notna().sum())} SFT steps")
    return f"{' and '.join(parts)}, read from {source}."


def default_sft_history(root: str | Path | None = None) -> Path | None:
    """The per-step SFT table training writes (catalog ``sft_history``,
    ``data/08_reporting/sft_history.csv``) when it exists: the fallback for a run whose
    MLflow record has no ``sft/loss``."""
    if root is None:
        from conductor_pipeline.paths import project_root

        root = project_root()
    path = Path(root) / "data" / "08_reporting" / "sft_history.csv"
    return path if path.is_file() else None


def stage_series(history: pd.DataFrame, metric: str) -> dict[str, pd.DataFrame]:
    """``{stage: frame(step, value)}`` of ``<stage>/<metric>`` for each stage present."""
    out = {}
    for stage in STAGES:
        column = f"{stage}/{metric}"
        if column in history:
            part = history[["step", column]].dropna()
            if len(part):
                out[stage] = part.rename(columns={column: "value"})
    return out


def _require(history: pd.DataFrame, metric: str) -> dict[str, pd.DataFrame]:
    series = stage_series(history, metric)
    if not series:
        raise MissingInput(f"the training history has no '<stage>/{metric}' metric")
    return series


def _line_plot(ax, series: dict[str, pd.DataFrame], label: str, **style: Any) -> None:
    for stage, part in series.items():
        ax.plot(part["step"], part["value"], marker=".", label=f"{label} ({stage})", **style)


def _step_axis(ax) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("training step")


def reward_figure(history: pd.DataFrame):
    """Mean reward per step (± one standard deviation), and the correctness part of it."""
    mean = _require(history, "reward/mean")
    std = stage_series(history, "reward/std")
    figure = new_figure()
    ax = figure.add_subplot(1, 1, 1)
    for stage, part in mean.items():
        ax.plot(part["step"], part["value"], marker=".", label=f"mean reward ({stage})")
        if stage in std:
            merged = part.merge(std[stage], on="step", suffixes=("", "_std"))
            # the reward lives in [0, 1]; a band past it would show rewards no rollout can get
            low, high = REWARD_RANGE
            ax.fill_between(
                merged["step"],
                (merged["value"] - merged["value_std"]).clip(low, high),
                (merged["value"] + merged["value_std"]).clip(low, high),
                alpha=0.15,
            )
    _line_plot(ax, stage_series(history, "reward/correctness_mean"), "correctness", linestyle="--")
    _step_axis(ax)
    ax.set_ylabel("reward")
    ax.set_ylim(REWARD_RANGE[0] - 0.05, REWARD_RANGE[1] + 0.05)
    ax.set_title(
        "Reward per GRPO step (band: ± one standard deviation across rollouts, within [0, 1])"
    )
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    figure.tight_layout()
    return figure


def parse_rate_figure(history: pd.DataFrame):
    """Share of rollouts that were a valid workflow, and the accuracy of those scored."""
    parse = _require(history, "rollouts/parse_rate")
    figure = new_figure()
    ax = figure.add_subplot(1, 1, 1)
    _line_plot(ax, parse, "parse rate")
    _line_plot(ax, stage_series(history, "rollouts/accuracy"), "accuracy of scored rollouts")
    ax.set_ylim(-0.05, 1.05)
    _step_axis(ax)
    ax.set_ylabel("share of rollouts")
    ax.set_title("Workflow parse rate and rollout accuracy")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    figure.tight_layout()
    return figure


def worker_usage(history: pd.DataFrame) -> pd.DataFrame:
    """Per step, the share of workflow steps given to each worker (columns = workers)."""
    marker = "/workers/share/"
    columns = [c for c in history.columns if marker in c]
    if not columns:
        raise MissingInput("the training history has no '<stage>/workers/share/<worker>' metrics")
    frames = []
    for stage in STAGES:
        picked = [c for c in columns if c.startswith(f"{stage}{marker}")]
        if not picked:
            continue
        part = history[["step", *picked]].dropna(how="all", subset=picked)
        part = part.rename(columns={c: c.split(marker, 1)[1] for c in picked})
        frames.append(part)
    usage = pd.concat(frames, ignore_index=True).groupby("step", as_index=False).last()
    return usage.fillna(0.0)


def worker_usage_figure(history: pd.DataFrame):
    usage = worker_usage(history)
    workers = [c for c in usage.columns if c != "step"]
    figure = new_figure()
    ax = figure.add_subplot(1, 1, 1)
    ax.stackplot(
        usage["step"],
        *[usage[w] for w in workers],
        labels=[f"{w} (simulated)" if w.startswith("sim-") else w for w in workers],
        alpha=0.85,
    )
    ax.set_ylim(0, 1)
    _step_axis(ax)
    ax.set_ylabel("share of workflow steps")
    ax.set_title("Which workers the Conductor calls during training")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    figure.tight_layout()
    return figure


def _merged_stages(history: pd.DataFrame, columns: dict[str, str]) -> pd.DataFrame:
    """``columns`` maps history columns to names; one row per step where any is logged,
    stages merged (a later stage's value wins at a shared step), missing values 0."""
    frames = []
    for stage in STAGES:
        picked = [c for c in columns if c.startswith(f"{stage}/")]
        if picked:
            part = history[["step", *picked]].dropna(how="all", subset=picked)
            frames.append(part.rename(columns={c: columns[c] for c in picked}))
    merged = pd.concat(frames, ignore_index=True).groupby("step", as_index=False).last()
    return merged.fillna(0.0)


def answer_workers_by_domain(history: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """``{domain: frame(step, <worker>...)}``: per step where the domain was sampled, the
    share of its parsed rollouts whose answer (last) step went to each worker."""
    pattern = re.compile(rf"^(?:{'|'.join(STAGES)})/domain/([^/]+)/worker/(.+)$")
    by_domain: dict[str, dict[str, str]] = {}
    for column in history.columns:
        match = pattern.match(str(column))
        if match:
            by_domain.setdefault(match.group(1), {})[column] = match.group(2)
    if not by_domain:
        raise MissingInput(
            "the training history has no '<stage>/domain/<domain>/worker/<worker>' metrics"
        )
    return {d: _merged_stages(history, cols) for d, cols in sorted(by_domain.items())}


def shape_history(history: pd.DataFrame) -> pd.DataFrame:
    """Per step: the share of parsed rollouts per workflow shape, and ``multi-step``."""
    columns = {}
    for column in history.columns:
        stage, _, rest = str(column).partition("/")
        if stage not in STAGES:
            continue
        if rest.startswith("shape/"):
            columns[column] = rest[len("shape/") :]
        elif rest == "workflow/multi_step_share":
            columns[column] = "multi-step"
    if not columns:
        raise MissingInput("the training history has no '<stage>/shape/<shape>' metrics")
    return _merged_stages(history, columns)


def worker_label(worker: str) -> str:
    return f"{worker} (simulated)" if worker.startswith("sim-") else worker


def _answer_panel(ax, domain: str, shares: pd.DataFrame, colours: dict[str, Any]) -> None:
    workers = [c for c in shares.columns if c != "step"]
    ax.stackplot(
        shares["step"],
        *[shares[w] for w in workers],
        colors=[colours[w] for w in workers],
        alpha=0.85,
    )
    ax.set_ylim(0, 1)
    _step_axis(ax)
    ax.set_title(f"{domain}: who writes the answer", fontsize=9)
    ax.set_ylabel("share of rollouts", fontsize=8)


def _shape_panel(ax, shapes: pd.DataFrame) -> None:
    for shape in [c for c in shapes.columns if c not in ("step", "multi-step")]:
        if shapes[shape].max() > 0:
            ax.plot(shapes["step"], shapes[shape], marker=".", label=shape)
    if "multi-step" in shapes:
        ax.plot(shapes["step"], shapes["multi-step"], "k--", label="multi-step")
    ax.set_ylim(-0.05, 1.05)
    _step_axis(ax)
    ax.set_title("Workflow shapes (all domains)", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(True, alpha=0.3)


def routing_figure(history: pd.DataFrame):
    """What the Conductor learns over training: for each domain, the share of rollouts whose
    answer step goes to each worker (stacked), and one panel of workflow-shape shares."""
    by_domain = answer_workers_by_domain(history)
    try:
        shapes = shape_history(history)
    except MissingInput:
        shapes = None
    panels = len(by_domain) + (shapes is not None)
    ncols = min(3, panels)
    nrows = math.ceil(panels / ncols)
    figure = new_figure(4.2 * ncols, 3.0 * nrows + 0.6)
    workers = list(dict.fromkeys(w for f in by_domain.values() for w in f.columns if w != "step"))
    palette = [f"C{i}" for i in range(10)]
    colours = {w: palette[i % len(palette)] for i, w in enumerate(workers)}
    for i, (domain, shares) in enumerate(by_domain.items()):
        _answer_panel(figure.add_subplot(nrows, ncols, i + 1), domain, shares, colours)
    if shapes is not None:
        _shape_panel(figure.add_subplot(nrows, ncols, panels), shapes)
    steps = stage_steps(history)  # the GRPO steps, not the SFT steps logged alongside
    first, last = (steps.min(), steps.max()) if len(steps) else (0, 0)
    if last > first:  # one step axis for every panel, though a domain is not sampled each step
        for ax in figure.axes:
            ax.set_xlim(first, last)
    from matplotlib.patches import Patch

    figure.legend(
        handles=[Patch(color=colours[w], label=worker_label(w)) for w in workers],
        loc="lower center",
        ncol=min(len(workers), 4),
        fontsize=7,
    )
    figure.tight_layout(rect=(0, 0.08 if nrows == 1 else 0.05, 1, 1))
    return figure


def cost_figure(history: pd.DataFrame):
    """Worker cost per rollout (list price) and steps per workflow."""
    cost = _require(history, "workflow/cost_usd_mean")
    figure = new_figure()
    ax = figure.add_subplot(1, 1, 1)
    _line_plot(ax, cost, "worker cost per rollout (USD)")
    list_cost = stage_series(history, "workflow/list_cost_usd_mean")
    if list_cost:
        _line_plot(ax, list_cost, "at list price, cache hits included", linestyle=":")
    _step_axis(ax)
    ax.set_ylabel("USD per rollout")
    steps = stage_series(history, "workflow/steps_mean")
    if steps:
        twin = ax.twinx()
        for stage, part in steps.items():
            twin.plot(
                part["step"], part["value"], color="grey", alpha=0.6, label=f"steps ({stage})"
            )
        twin.set_ylabel("workflow steps (grey)")
    ax.set_title("Cost per rollout over training")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    figure.tight_layout()
    return figure


# --- does the warm start write multi-step workflows, and does trying pay? ------------------

# GRPO step 1's rollouts are sampled from the SFT warm start, before any GRPO update
WARM_START_STEP = 1
# (metric, what it measures, comparison, target): what the warm start should hand GRPO
WARM_START_TARGETS: tuple[tuple[str, str, str, float], ...] = (
    ("rollouts/parse_rate", "parse rate", ">=", 0.95),
    ("rollouts/multi_step_attempt_share", "multi-step share of all attempts", ">=", 0.35),
    ("rollouts/unequal_lists_rate", "unequal-length failures", "<=", 0.02),
)
# the metrics of the multi-step figure, with what a run that lacks them is told
MULTI_STEP_METRICS = {
    "rollouts/multi_step_attempt_share": "multi-step share of all attempts",
    "workflow/multi_step_share": "multi-step share of parsed workflows",
    "reward/multi_minus_single": "reward gap, multi-step minus single-step",
}
OLDER_RUN = "not logged by this run (an older run, from before the metric existed)"


def warm_start_check(history: pd.DataFrame, stage: str = "grpo") -> pd.DataFrame:
    """The warm start's rollouts against their targets (:data:`WARM_START_TARGETS`), read
    at ``<stage>`` step :data:`WARM_START_STEP`: one row per check with ``check``,
    ``metric`` (the history column), ``value`` (NaN when not logged), ``target``,
    ``comparison`` (``>=`` or ``<=``), ``met`` (True, False, or None when not logged) and
    ``missing`` (why there is no value, else "")."""
    columns = [c for c in history.columns if str(c).startswith(f"{stage}/")]
    logged = history.loc[history[columns].notna().any(axis=1), "step"] if columns else []
    if not len(logged):
        raise MissingInput(f"the training history has no '{stage}/…' metrics")
    at_step = history[history["step"] == WARM_START_STEP]
    if at_step.empty or not at_step[columns].notna().any(axis=None):
        raise MissingInput(
            f"the training history has no {stage} step {WARM_START_STEP} (its first logged "
            f"{stage} step is {int(min(logged))}): the warm start check reads the rollouts "
            "sampled before any GRPO update"
        )
    rows = []
    for metric, label, comparison, target in WARM_START_TARGETS:
        column = f"{stage}/{metric}"
        values = at_step[column].dropna() if column in at_step else pd.Series([], dtype=float)
        value = float(values.iloc[-1]) if len(values) else math.nan
        if math.isnan(value):
            met = None
            missing = (
                OLDER_RUN if column not in history else f"not logged at step {WARM_START_STEP}"
            )
        else:
            met = value >= target if comparison == ">=" else value <= target
            missing = ""
        rows.append(
            {
                "check": label,
                "metric": column,
                "value": value,
                "target": target,
                "comparison": comparison,
                "met": met,
                "missing": missing,
            }
        )
    return pd.DataFrame(rows)


def warm_start_section(history: pd.DataFrame) -> list[Any]:
    """One line on how many of the warm start's targets GRPO step 1 meets, then the table:
    each check's value at step 1 beside its target and whether it is met."""
    check = warm_start_check(history)
    judged = check[check["met"].notna()]
    line = (
        f"**Warm start check** (GRPO step {WARM_START_STEP}: its rollouts are sampled from the "
        "SFT warm start, before any GRPO update): "
    )
    if len(judged):
        met = judged["met"].astype(bool)
        line += f"{int(met.sum())} of {len(judged)} targets met"
        failed = judged.loc[~met, "check"].tolist()
        line += f"; not met: {', '.join(failed)}." if failed else "."
    else:
        line += "no target can be judged."
    lacking = check[check["met"].isna()]
    for reason, checks in lacking.groupby("missing", sort=False)["check"]:
        text = f"{', '.join(checks)}: {reason}"
        line += f" {text[0].upper()}{text[1:]}."
    table = pd.DataFrame(
        {
            "check": check["check"],
            f"step {WARM_START_STEP}": [
                "—" if math.isnan(v) else f"{100 * v:.1f}%" for v in check["value"]
            ],
            "target": [
                f"{'≥' if c == '>=' else '≤'} {100 * t:.0f}%"
                for c, t in zip(check["comparison"], check["target"], strict=True)
            ],
            "met": [
                "yes" if m is True else "no" if m is False else "not logged"  # the line says why
                for m in check["met"]
            ],
            "metric": check["metric"],
        }
    )
    return [line, table]


def _absent(history: pd.DataFrame, metric: str) -> str:
    """Why ``<stage>/<metric>`` draws no line: never logged by this run, or logged empty."""
    if any(f"{stage}/{metric}" in history for stage in STAGES):
        if metric == "reward/multi_minus_single":
            return "at no step did a group hold both single- and multi-step attempts"
        return "logged at no step"
    return OLDER_RUN


def multi_step_figure(history: pd.DataFrame):
    """Two panels over the training steps: the multi-step share of all attempts (parsed or
    not) and of the parsed workflows; and the reward gap of multi-step minus single-step
    attempts in the same groups, where a step had such a group, with a zero line. Returns
    the figure, followed by a note naming the metrics this history lacks, if any."""
    series = {metric: stage_series(history, metric) for metric in MULTI_STEP_METRICS}
    if not any(series.values()):
        raise MissingInput(
            "the training history has none of "
            + ", ".join(f"'<stage>/{m}'" for m in MULTI_STEP_METRICS)
            + f" ({OLDER_RUN})"
        )
    figure = new_figure(11.0, 3.8)
    share_ax = figure.add_subplot(1, 2, 1)
    _line_plot(share_ax, series["rollouts/multi_step_attempt_share"], "all attempts, parsed or not")
    _line_plot(
        share_ax, series["workflow/multi_step_share"], "parsed workflows only", linestyle="--"
    )
    share_ax.set_ylim(-0.05, 1.05)
    share_ax.set_ylabel("share with two or more steps")
    share_ax.set_title("Multi-step share per step", fontsize=10)
    gap_ax = figure.add_subplot(1, 2, 2)
    gap_ax.axhline(0.0, color="grey", linewidth=1)
    for stage, part in series["reward/multi_minus_single"].items():
        # points only: a step without a group holding both kinds of attempt has no value
        gap_ax.plot(
            part["step"], part["value"], marker="o", linestyle="none", label=f"reward gap ({stage})"
        )
    low, high = gap_ax.get_ylim() if series["reward/multi_minus_single"] else (-1.0, 1.0)
    gap_ax.set_ylim(min(low, -0.05), max(high, 0.05))  # the zero line always in view
    gap_ax.set_ylabel("mean reward, multi − single")
    gap_ax.set_title("Reward gap: multi-step minus single-step attempts (same groups)", fontsize=10)
    missing = {m: _absent(history, m) for m, s in series.items() if not s}
    for ax, metrics in (
        (share_ax, ("rollouts/multi_step_attempt_share", "workflow/multi_step_share")),
        (gap_ax, ("reward/multi_minus_single",)),
    ):
        absent = [m for m in metrics if m in missing]
        if absent:
            ax.text(
                0.5, 0.5, "\n".join(f"{MULTI_STEP_METRICS[m]}:\n{missing[m]}" for m in absent),
                transform=ax.transAxes, ha="center", va="center", fontsize=8, wrap=True,
                bbox={"facecolor": "white", "edgecolor": "none"},
            )  # fmt: skip
        if len(absent) < len(metrics):
            ax.legend(fontsize=8)
        _step_axis(ax)
        ax.grid(True, alpha=0.3)
    steps = stage_steps(history)
    if len(steps) and steps.max() > steps.min():  # both panels on the GRPO steps
        for ax in (share_ax, gap_ax):
            ax.set_xlim(steps.min() - 0.5, steps.max() + 0.5)
    figure.suptitle(
        "Does the Conductor try multi-step workflows, and does trying pay?", fontsize=11
    )
    figure.tight_layout()
    if not missing:
        return figure
    return [
        figure,
        "*Not drawn: "
        + "; ".join(f"{MULTI_STEP_METRICS[m]} (`{m}`), {why}" for m, why in missing.items())
        + ".*",
    ]


_SUMMARY_METRICS = {
    "reward/mean": "mean reward",
    "rollouts/parse_rate": "parse rate",
    "rollouts/accuracy": "rollout accuracy",
    "workflow/steps_mean": "steps per workflow",
    "workflow/cost_usd_mean": "worker cost per rollout (USD)",
    "rollouts/infra_failure_rate": "infrastructure failure rate",
}


def start_end_table(history: pd.DataFrame) -> pd.DataFrame:
    """First and last logged value of the headline metrics, per stage."""
    rows = []
    for metric, label in _SUMMARY_METRICS.items():
        for stage, part in stage_series(history, metric).items():
            rows.append(
                {
                    "metric": label,
                    "stage": stage,
                    "first step": int(part["step"].iloc[0]),
                    "first": part["value"].iloc[0],
                    "last step": int(part["step"].iloc[-1]),
                    "last": part["value"].iloc[-1],
                }
            )
    if not rows:
        raise MissingInput("the training history has none of the headline metrics")
    return pd.DataFrame(rows)


def sft_loss(
    history: pd.DataFrame | None,
    adapter_info: dict[str, Any] | None = None,
    sft_history_path: str | Path | None = None,
) -> tuple[pd.DataFrame, str]:
    """The warm start's loss per step as ``frame(step, loss)`` and where it came from.

    Sources, first found wins: the MLflow metric ``sft/loss`` (in ``history``), a per-step
    table at ``sft_history_path`` (columns ``step`` and ``loss`` or ``sft/loss``), the
    ``history`` records of the adapter info's ``sft`` entry. Raises :class:`MissingInput`
    naming what is there instead (often only ``sft/final_loss``)."""
    if history is not None and "sft/loss" in history:
        part = history[["step", "sft/loss"]].dropna()
        if len(part):
            return part.rename(columns={"sft/loss": "loss"}).reset_index(drop=True), (
                "the MLflow metric sft/loss"
            )
    if sft_history_path and Path(sft_history_path).is_file():
        table = _read_table(sft_history_path)
        column = next((c for c in ("loss", "sft/loss") if c in table), None)
        if column and "step" in table and len(table.dropna(subset=[column])):
            part = table[["step", column]].dropna().rename(columns={column: "loss"})
            return part.sort_values("step").reset_index(drop=True), str(sft_history_path)
    sft = (adapter_info or {}).get("sft") or {}
    records = sft.get("history") if isinstance(sft, dict) else None
    if records:
        table = pd.DataFrame(records)
        if {"step", "loss"} <= set(table.columns) and len(table.dropna(subset=["loss"])):
            part = table[["step", "loss"]].dropna().sort_values("step")
            return part.reset_index(drop=True), "the adapter info's SFT history"
    final = sft.get("final_loss") if isinstance(sft, dict) else None
    if sft.get("reused"):
        raise MissingInput("no SFT loss curve: the warm start was reused from an earlier run")
    detail = (
        f"only the final loss ({float(final):.3f} after {sft.get('steps')} steps) was recorded"
        if isinstance(final, int | float)
        else "no SFT loss was recorded"
    )
    raise MissingInput(
        f"no SFT loss curve: this run logged no per-step SFT loss (MLflow metric sft/loss); "
        f"{detail}"
    )


def sft_loss_figure(
    history: pd.DataFrame | None,
    adapter_info: dict[str, Any] | None = None,
    sft_history_path: str | Path | None = None,
):
    """The warm start's (SFT) training loss per step."""
    loss, source = sft_loss(history, adapter_info, sft_history_path)
    figure = new_figure(8.0, 3.6)
    ax = figure.add_subplot(1, 1, 1)
    ax.plot(loss["step"], loss["loss"], marker=".", label="SFT loss")
    _step_axis(ax)
    ax.set_xlabel("SFT step")
    ax.set_ylabel("loss (completion tokens)")
    ax.set_title(f"Warm start: SFT loss per step (from {source})", fontsize=10)
    ax.grid(True, alpha=0.3)
    figure.tight_layout()
    return figure
