"""Nightly regression flow through a real Prefect server: the deployment registers with its cron schedule;
a nightly with the canonical double then one with the buggy double are triggered through the server; the
second is flagged (pass@1 drop and a must-pass failure), lists the flipped tasks, and its flow run is Failed.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

from mlflow.tracking import MlflowClient

from conftest import REPO, base_env, needs_data, stop_group


def _deployment(api: str):
    """(cron, timezone) of the registered deployment's schedule, or None while it is not registered."""
    import urllib.error
    import urllib.request

    try:
        d = json.loads(urllib.request.urlopen(f"{api}/deployments/name/fixlab-nightly/nightly", timeout=5).read())
    except urllib.error.HTTPError:
        return None
    return [(s["schedule"]["cron"], s["schedule"]["timezone"], s["active"]) for s in d["schedules"]]


def _scheduled_starts(api: str) -> list[str]:
    """Expected start times of the runs the server's scheduler has queued for the nightly deployment."""
    import urllib.request

    d = json.loads(urllib.request.urlopen(f"{api}/deployments/name/fixlab-nightly/nightly", timeout=5).read())
    body = {"deployments": {"id": {"any_": [d["id"]]}}, "flow_runs": {"state": {"type": {"any_": ["SCHEDULED"]}}}}
    req = urllib.request.Request(f"{api}/flow_runs/filter", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    return [r["expected_start_time"] for r in json.loads(urllib.request.urlopen(req, timeout=10).read())]


@needs_data
def test_nightly_deployment_flags_regression_against_last_good_run(tmp_path, prefect_api):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    common = [f"tracking.uri={uri}", f"tracking.artifacts={tmp_path}/artifacts", "dataset.limit=4",
              "nightly.must_pass=[Python/1]"]
    env = base_env(tmp_path)
    env["PREFECT_API_URL"] = prefect_api
    log = open(tmp_path / "serve.log", "w")
    serve = subprocess.Popen([sys.executable, "-m", "flows.nightly", "serve", "model=canonical", *common], cwd=REPO,
                             env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while (schedules := _deployment(prefect_api)) is None:
            assert serve.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "deployment did not register"
            time.sleep(1)
        assert schedules == [("0 2 * * *", "UTC", True)]  # conf/nightly.yaml's default: nightly at 02:00

        def now(*overrides):
            p = subprocess.run([sys.executable, "-m", "flows.nightly", "now", "--wait", *overrides, *common],
                               cwd=REPO, env=env, capture_output=True, text=True, timeout=400)
            assert p.stdout.strip(), p.stderr[-3000:] + (tmp_path / "serve.log").read_text()[-3000:]
            return p.returncode, json.loads(p.stdout.strip().splitlines()[-1])

        rc1, good = now("model=canonical")
        assert (rc1, good["state"]) == (0, "COMPLETED"), good
        rc2, bad = now("model=buggy")
        assert (rc2, bad["state"]) == (1, "FAILED"), bad
        assert "pass@1 dropped by 1.0000" in bad["message"] and "Python/1" in bad["message"]
        # The real server's scheduler (the temporary server has none) queued the coming nights at 02:00 UTC.
        deadline = time.monotonic() + 90
        while not (starts := _scheduled_starts(prefect_api)) and time.monotonic() < deadline:
            time.sleep(2)
        assert starts and all(re.search(r"T02:00:00(\.0+)?(Z|\+00:00)$", t) for t in starts), starts
    finally:
        stop_group(serve, 20)
        log.close()

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("humanevalfix-nightly")
    runs = client.search_runs([exp.experiment_id], "tags.`fixlab.nightly` = 'true'",
                              order_by=["attributes.start_time ASC"])
    assert [r.data.tags["model"] for r in runs] == ["canonical", "buggy"]
    first, second = runs
    assert first.data.tags["fixlab.nightly.verdict"] == "ok"
    assert second.data.tags["fixlab.nightly.verdict"] == "regression"
    assert second.data.tags["fixlab.nightly.baseline"] == first.info.run_id
    assert second.data.metrics["nightly_pass_at_1_delta"] == -1.0 and second.data.metrics["nightly_pass_to_fail"] == 4

    report = json.loads(Path(client.download_artifacts(second.info.run_id, "nightly/regression_report.json",
                                                       str(tmp_path))).read_text())
    assert report["pass_to_fail"] == ["Python/0", "Python/1", "Python/2", "Python/3"]
    assert report["fail_to_pass"] == [] and report["must_pass_failed"] == ["Python/1"]
    assert report["harness_errors"] == {}
    assert report["baseline"]["run_id"] == first.info.run_id
    assert set(report["tokens"]) == {"current", "baseline", "delta"} and "delta" in report["wall_s"]
    assert report["config_changes"]["model.name"] == ["canonical", "buggy"]
    md = Path(client.download_artifacts(second.info.run_id, "nightly/regression_report.md", str(tmp_path))).read_text()
    assert md.startswith("# Nightly regression report: REGRESSION")
    assert "Python/0, Python/1, Python/2, Python/3" in md
    (tmp_path / "report_seen.md").write_text(md)
