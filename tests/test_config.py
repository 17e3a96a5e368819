"""One typed config: every yaml file composes against its record and holds only what differs from it, and a wrong
key or type anywhere (command line, yaml file, a dict built in code) is one line naming it and the nearest key."""
from __future__ import annotations

import dataclasses
import shutil

import pytest
import yaml

from conftest import REPO, job_settings
from flows import evaluate, schema
from flows.config import ConfigError, settings_from

GROUPS = ("model", "strategy", "sandbox", "runner", "dataset")
OPTIONS = [(g, p.stem) for g in GROUPS for p in sorted((REPO / "conf" / g).glob("*.yaml"))]


@pytest.mark.parametrize("group, option", OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_every_option_composes_and_its_yaml_holds_only_what_differs_from_its_record(group, option):
    settings = job_settings(f"{group}={option}")
    record = getattr(settings, group) if group != "strategy" else settings.agent.strategy
    defaults = {f.name: f.default if f.default is not dataclasses.MISSING else
                (f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
                for f in dataclasses.fields(record)}
    raw = yaml.safe_load((REPO / "conf" / group / f"{option}.yaml").read_text()) or {}
    named = "dataset" if group == "dataset" else getattr(record, "backend", None) or record.name
    assert raw.pop("defaults") == [f"{named}_schema"]  # the record first, then what differs from it
    for key, value in raw.items():
        assert key in defaults, f"conf/{group}/{option}.yaml: {key} is not a {type(record).__name__} setting"
        assert value != defaults[key], f"conf/{group}/{option}.yaml repeats {key}'s default ({value!r})"
        assert getattr(record, key) == value


@pytest.mark.parametrize("args, line", [
    (["strategy=react", "strategy.max_turn=3"], "unknown key strategy.max_turn: did you mean max_turns?"),
    (["model.max_bacth=4"], "unknown key model.max_bacth: did you mean max_batch?"),
    (["model=together-llama3.3-70b", "model.max_retrys=2"], "unknown key model.max_retrys: did you mean max_retries?"),
    (["sandbox.workrs=2"], "unknown key sandbox.workrs: did you mean workers?"),
    (["runner=dask", "runner.adress=tcp://x:1"], "unknown key runner.adress: did you mean address?"),
    (["dataset.limt=3"], "unknown key dataset.limt: did you mean limit?"),
    (["tracking.experimnt=x"], "unknown key tracking.experimnt: did you mean experiment?"),
    (["iterz=3"], "unknown key iterz: did you mean iters?"),
    (["strategy=react", "strategy.candidates=2"], "strategy=react has no candidates (single_shot and reflection"),
    (["strategy=reflection", "strategy.rewrite_when_stuck=3"],
     "strategy.rewrite_when_stuck must be true or false, got 3"),
    (["strategy=reflection", "strategy.history_rounds=abc"], "strategy.history_rounds must be an integer, got 'abc'"),
    (["strategy=reflection", "strategy.temperature_stop=0.3"], "unknown key strategy.temperature_stop: did you mean temperature_schedule?"),
    (["strategy.redraws=1,true", "-m"], "strategy.redraws must be an integer, got True"),  # a later value of a sweep
    (["model=nope"], "model=nope is unknown: use one of answers, buggy, canonical"),
    (["iters=-1"], "iters must be an integer >= 0, got -1"),
])
def test_a_wrong_key_or_value_on_the_command_line_is_one_line(args, line):
    problem = evaluate.check_overrides(args)
    assert problem is not None and line in problem and "\n" not in problem, problem


@pytest.mark.parametrize("text, line", [
    ("max_turn: 4\n", "unknown key strategy.max_turn: did you mean max_turns? (conf/strategy/mine.yaml)"),
    ("max_turns: abc\n", "strategy.max_turns must be an integer, got 'abc' (conf/strategy/mine.yaml)"),
    ("rewrite_when_stuck: 3\n", "strategy.rewrite_when_stuck must be true or false, got 3 (conf/strategy/mine.yaml)"),
])
def test_a_wrong_key_or_value_in_a_yaml_file_names_the_file(tmp_path, monkeypatch, text, line):
    conf = tmp_path / "conf"
    shutil.copytree(REPO / "conf", conf)
    (conf / "strategy" / "mine.yaml").write_text("defaults:\n  - react_schema\n" + text)
    monkeypatch.setattr(evaluate, "CONF_DIR", conf)
    monkeypatch.setattr(schema, "CONF_DIR", conf)
    assert evaluate.check_overrides(["strategy=mine"]) == line


def test_a_dict_built_in_code_is_checked_the_same_way():
    from omegaconf import OmegaConf

    cfg = OmegaConf.to_container(OmegaConf.structured(schema.JobConf), resolve=False)
    cfg.update(model={"name": "m", "backend": "transformers", "pack": "p", "max_bach": 3},
               strategy={"name": "single_shot"}, sandbox={"backend": "local"}, runner={"name": "threads"})
    with pytest.raises(ConfigError, match=r"^unknown key model.max_bach: did you mean max_batch\?$"):
        settings_from(cfg)
    cfg["model"] = {"name": "m", "backend": "transformers", "batching": "yes"}
    with pytest.raises(ConfigError, match=r"^model.batching must be true or false, got 'yes'$"):
        settings_from(cfg)
    cfg["model"] = {"name": "m", "backend": "tpu"}
    with pytest.raises(ConfigError, match=r"model.backend 'tpu' is unknown: use transformers \| llamacpp"):
        settings_from(cfg)


def test_the_job_and_the_agent_share_their_defaults():
    """The run-level defaults are AgentConfig's; the job takes them from there, and the sandbox's from SandboxConf."""
    from agents.config import AgentConfig, SingleShotConf

    settings = job_settings()
    assert dataclasses.replace(settings.agent, strategy=SingleShotConf()) == AgentConfig(SingleShotConf())
    assert settings.agent.strategy == SingleShotConf() and settings.run_ahead == 0
    assert job_settings("iters=1", "sweep_ahead_to=3").run_ahead == 3  # what the sweep callback adds to each job
    assert job_settings("sweep_ahead_to=3", "sweep_ahead=false").run_ahead == 0
