"""Prefect flows: `evaluate` (one Hydra job = one flow run over all tasks) and `nightly`.

Importing this package applies the settings that keep the stack quiet and off the network for
telemetry; the user's own environment always wins (setdefault).
"""
import os

for _k, _v in {
    "DO_NOT_TRACK": "true",  # MLflow ignores "1"
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    # The temporary Prefect server can take longer to start on 2 cores than its default 20 s limit allows.
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
    # One log line per task run is noise at 164 tasks; fixlab prints its own progress.
    "PREFECT_LOGGING_LOGGERS_PREFECT_TASK_RUNS_LEVEL": "WARNING",
    "TOKENIZERS_PARALLELISM": "false",
}.items():
    os.environ.setdefault(_k, _v)
