#!/usr/bin/env bash
# Regenerate the Airflow DAG of the retraining pipeline (needs the `airflow` extra:
# pip install -e ".[airflow]"). Nodes joined by in-memory datasets share one task
# (--group-by memory), so every task can run in its own process or container.
set -euo pipefail
cd "$(dirname "$0")/.."
KEDRO_DISABLE_TELEMETRY=true "${KEDRO:-.venv/bin/kedro}" airflow create \
  --pipelines retraining \
  --group-by memory \
  --target-dir airflow/dags \
  --jinja-file airflow/conductor_dag_template.j2 \
  --params "schedule='${RETRAINING_SCHEDULE:-@weekly}',max_active_runs=1,retries=1,retry_delay=10,catchup=False,owner=conductor-pipeline"
