"""`python -m flows.evaluate [overrides] [-m]`: one Hydra job = one Prefect flow run = one MLflow run.

The command line around flows/job.py's `run_job`: Hydra composes the config (conf/, checked against its records:
flows/schema.py), settings_from types it (flows/config.py), run_job runs it, and one JSON summary line goes to
stdout. Bad input is one line on stderr (exit 2); SIGTERM and Ctrl-C stop a job within seconds (`resume=last`
continues it).
"""
from __future__ import annotations

import gc
import json
import sys

import hydra
from omegaconf import DictConfig, OmegaConf

from agents.models import ModelUnavailable
from agents.tasks import DatasetError
from sandboxes import SandboxUnavailable

from . import schema
from .schema import CONF_DIR
from .config import ConfigError, settings_from
from .job import run_job, stopped
from .prefect_api import stop_prefect_api
from .stop import ReaderMayLeave, Stop, stop_on_signals
from .workers import close_all

USER_ERRORS = (ConfigError, DatasetError, ModelUnavailable, SandboxUnavailable)


FAILED_RUNS: list[str] = []  # this process's runs that ended FAILED (tasks that ended in an error): exit 1


@hydra.main(config_path="conf", config_name="config", version_base=None)
def main(cfg: DictConfig) -> float:
    try:
        settings = settings_from(OmegaConf.to_container(cfg, resolve=True))
        if settings.model.backend == "answers":  # its runner is flows/rescore.py's: no agent may ask it
            raise ConfigError("model=answers judges answers already made: run `python -m flows.rescore --answers FILE` "
                              "or `python -m flows.rescore RUN_ID`")
        summary = run_job(settings, on_open=Stop.hold)
    except USER_ERRORS as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        close_all()
        sys.exit(2)
    print(json.dumps(summary), flush=True)
    if summary.get("errors"):  # the run ended FAILED: a script or a scheduler must see it (the exit code, after a sweep)
        FAILED_RUNS.append(summary.get("run_id"))
    return summary["pass@1"]


def check_overrides(argv: list[str]) -> str | None:
    """Compose the config before Hydra runs, once per value of each swept key (the others at their first value), so
    an unknown key, option or value is one line instead of Hydra's multi-line report. Returns the error or None."""
    from hydra import compose, initialize_config_dir
    from hydra.core.override_parser.overrides_parser import OverridesParser

    args = [a for a in argv if not a.startswith("-")]
    try:
        parsed = [o for o in OverridesParser.create().parse_overrides(args)
                  if not o.get_key_element().startswith("hydra.")]
    except Exception as e:
        return schema.describe(e)
    first = [f"{o.get_key_element()}={next(iter(o.sweep_string_iterator()), None)}" if o.is_sweep_override()
             else o.input_line for o in parsed]
    variants = [first] + [first[:i] + [f"{o.get_key_element()}={v}"] + first[i + 1:]
                          for i, o in enumerate(parsed) if o.is_sweep_override()
                          for v in list(o.sweep_string_iterator())[1:]]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        for overrides in variants:
            try:
                cfg = compose(config_name="config", overrides=overrides, return_hydra_config=True)
                schema.check_composed(cfg, OverridesParser.create().parse_overrides(overrides))
                settings_from({k: OmegaConf.to_container(v, resolve=True) if OmegaConf.is_config(v) else v
                               for k, v in cfg.items() if k != "hydra"})
            except ConfigError as e:
                return str(e)
            except Exception as e:
                return schema.describe(e)
    return None


if __name__ == "__main__":
    ReaderMayLeave.install()
    problem = check_overrides(sys.argv[1:]) if not any(a in ("-h", "--help", "--cfg", "-c", "--info") for a in sys.argv) else None
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        sys.exit(2)
    stop_on_signals()
    try:
        main()
        if FAILED_RUNS:
            sys.exit(1)
    except BaseException as e:
        # After a stop signal every way out is the stop's (exit 130, the run marked KILLED). The stop does not always
        # surface as KeyboardInterrupt: Prefect raises its own TerminationSignal inside a flow, and an exception
        # raised while the job unwinds (a store or API call cut short) reaches Hydra, which exits 1, so a stopped job
        # could read as a crash. The watcher sets `signalled` within a switch interval of the signal; a short wait
        # covers it, and costs only a job that crashed on its own.
        # (Hydra's exit carries what it reports as its context; an exit of our own, bad input, is no stop.)
        if stopped(e.__context__ if isinstance(e, SystemExit) else e) or Stop.signalled.wait(0.05):
            Stop.leave()
        raise
    finally:
        close_all()
        stop_prefect_api()
        # Everything is written. The interpreter's last garbage collection walks every object the job's libraries
        # made (MLflow, SQLAlchemy, Prefect, transformers), seconds after the job's last line. Frozen objects are not
        # walked; the process's memory goes back to the OS as it exits anyway.
        gc.freeze()
