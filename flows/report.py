"""The results document: docs/RESULTS.md and the README's headline and speed blocks, generated from
benchmarks/results/*.json.

    python -m flows.report            # rewrite docs/RESULTS.md and the README blocks between the results markers
    python -m flows.report --check    # exit 1, naming the command that fixes it, where either differs from the files

Which results file feeds which table is declared once, in the registry below (SWEEPS, PAIRS, SPEED): a new results
file is one more entry there (SPEED_HEADLINE names the files of the README's speed paragraph). Every figure in the
output is read from a file or computed from one (pass@1 intervals and paired tests with flows.stats, on the per-task
outcomes benchmarks/fullsize.py records); the text in this module carries no figure, and a results file no table
names fails `--check` (tests/test_report.py).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import textwrap
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from statistics import fmean

from .stats import Paired, paired, sign_test_p, wilson
from .frontier import FrontierError, png_bytes

REPO = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO / "benchmarks" / "results"
DOC = REPO / "docs" / "RESULTS.md"
README = REPO / "README.md"
HEADLINE_START, HEADLINE_END = "<!-- results:headline -->", "<!-- /results:headline -->"
SPEED_START, SPEED_END = "<!-- results:speed -->", "<!-- /results:speed -->"
COMMAND = "python -m flows.report"


# ---------------------------------------------------------------------------------------------------------------
# The registry: which file feeds which table. One entry per results file.
# ---------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Sweep:
    """A full-size sweep over budgets (a benchmarks/fullsize.py file, or the older full-default shape)."""
    file: str
    label: str  # what was run, in words (figures come from the file)
    machine: str  # the fullsize files do not record their CPU; the commit that added each one does
    tables: tuple[str, ...]  # strategies, protocols, small, bug_types, llamacpp, speed_history
    strategy: str | None = None  # keep only this strategy's runs (a file that holds two sweeps)
    candidates: int | None = None  # keep only the runs with this many candidates a round (a grid's row)
    no_wall: str = ""  # why the file's wall_s is not this sweep's wall time ("" = it is)
    change: str = ""  # speed_history: what changed at this commit


# The CPUs behind the machine names above (the fullsize files do not record theirs).
MACHINES = {"EPYC": "2-core AMD EPYC (AVX-512 VNNI and bf16)", "Xeon": "2-core Xeon (AVX-512 VNNI, no bf16)",
            "EPYC-AVX2": "2-core AMD EPYC (AVX2 only)", "Xeon-AMX": "2-core Xeon (AVX-512 VNNI, bf16, AMX)",
            "Xeon-AMX as AVX2": "the 2-core Xeon with AMX held to AVX2 (fixlab's kernels built for x86-64-v3; MKL, "
                                "oneDNN held to AVX2)"}


SWEEPS: dict[str, Sweep] = {
    "k2": Sweep("fullsize-single_shot-k2-epyc-fp32-20261126.json", "single_shot, 2 candidates a round", "EPYC",
                ("strategies", "bug_types")),
    # the candidates x budgets grid, one run of single_shot's answer stream (8 answers a task) and three cuts of it
    **{f"grid_k{k}": Sweep("fullsize-single_shot-stream-k1248-n8-epyc-20261126.json",
                           f"single_shot, {k} candidate{'s' if k > 1 else ''} a round"
                           + (" (the answer stream's job)" if k == 1 else " (cut from the answer stream)"), "EPYC",
                           ("grid",), candidates=k,
                           no_wall="the job that ran the stream was cut off by a session's end after 106 tasks (80 "
                                   "min) and resumed with `resume=<run id>`: wall_s covers the resumed part only"
                           if k == 1 else "") for k in (1, 2, 4, 8)},
    "default": Sweep("fullsize-single_shot-epyc-fp32-inplace-kv-20261125.json", "single_shot (`make eval`'s job)",
                     "EPYC", ("strategies", "protocols", "small", "bug_types", "llamacpp", "speed_history"),
                     change="KV cache edited in place, spare rows and columns (ca5282e)"),
    "default_grouped": Sweep("fullsize-single_shot-epyc-fp32-grouped-20261125.json", "single_shot, at 63474fc",
                             "EPYC", ("strategies", "speed_history"),
                             change="fp32 beside the int8 weights, fixlab's decode attention (63474fc)"),
    "default_bf16": Sweep("fullsize-single_shot-epyc-bf16-20261125.json",
                          "single_shot, bf16 beside int8 (before 63474fc)",
                          "EPYC", ("strategies", "protocols", "speed_history"),
                          change="int8 weights, bf16 elsewhere, SDPA attention (the start)"),
    "default_kv16": Sweep("fullsize-single_shot-default-native-kv16-epyc-20261127.json",
                          "single_shot, compiled int8 loops and float16 KV cache", "EPYC",
                          ("strategies", "speed_history", "llamacpp"),
                          change="compiled int8 rounding and scaling, float16 KV cache read by a compiled decode "
                                 "attention (ed8444b); run through benchmarks/memory.py"),
    "default_fma": Sweep("fullsize-single_shot-default-fma-attention-epyc-20261128.json",
                         "single_shot, decode attention with fused multiply-adds in registers", "EPYC",
                         ("strategies", "speed_history", "llamacpp"),
                         change="the compiled decode attention's AVX-512 path: fused multiply-adds, each block of "
                                "query rows' sums in registers; run through benchmarks/memory.py"),
    "default_paths": Sweep("fullsize-single_shot-default-paths-xeon-amx-20261128.json",
                           "single_shot (`make eval`'s job), the path measured on the machine", "Xeon-AMX",
                           ("strategies",)),
    "default_paths_avx2": Sweep("fullsize-single_shot-default-paths-xeon-amx-as-avx2-20261128.json",
                                "single_shot (`make eval`'s job), the same Xeon held to AVX2 (fixlab's AVX2 kernels)",
                                "Xeon-AMX as AVX2", ("strategies",)),
    "default_xeon": Sweep("fullsize-single_shot-budgets-20261125.json", "single_shot", "Xeon", ("strategies",),
                          strategy="single_shot"),
    "reflection": Sweep("fullsize-reflection-epyc-fp32-20261126.json",
                        "reflection (its defaults: `redraws: 2`, `rewrite_when_stuck`)", "EPYC", ("strategies",)),
    "reflection_xeon": Sweep("fullsize-reflection-int8-budgets-20261125.json", "reflection, `redraws: 0`", "Xeon",
                             ("strategies",)),
    "reflection_bf16": Sweep("fullsize-reflection-budgets-20261125.json",
                             "reflection, `redraws: 0`, bf16 weights (before int8)", "EPYC", ("strategies",)),
    "portfolio_stopped": Sweep("fullsize-portfolio-stopped-at-110min-epyc-20261127.json",
                               "portfolio (a fresh draft, then one revision of it, in turn), 8 rounds: stopped after "
                               "110 min, the tasks it finished (not a random sample: the hardest were still running)",
                               "EPYC", ("strategies",),
                               no_wall="stopped with Ctrl-C; a killed run logs no metrics"),
    "stream16": Sweep("fullsize-single_shot-stream-n16-epyc-20261127.json",
                      "single_shot's answer stream to 16 answers, one candidate a round", "EPYC", ("strategies",),
                      no_wall="stopped at 127 of 164 tasks after 103 min and resumed twice with `resume=<run id>`: "
                              "wall_s covers the last part only"),
    "react": Sweep("fullsize-react-epyc-fp32-20261126.json", "react (its defaults: 4 turns, `rewrite_when_stuck`)",
                   "EPYC", ("strategies",)),
    "react_12": Sweep("fullsize-react-stopped-at-72min-epyc-20261126.json",
                      "react, 12 turns, no rewrite: stopped early, the tasks it finished (not a random sample)", "EPYC",
                      ("strategies",), no_wall="stopped, then logged from the trajectory cache"),
    "reflection_llamacpp_old": Sweep("full-default-20261124.json",
                                     "reflection through llama.cpp (the default then): stopped early", "EPYC-AVX2",
                                     ("strategies",), no_wall="stopped; the file states its wall in words"),
    "llamacpp": Sweep("fullsize-single_shot-llamacpp-32slots-epyc-20261126.json",
                      "single_shot through llama.cpp, 32 slots", "EPYC", ("llamacpp",)),
    "llamacpp_kv16": Sweep("fullsize-single_shot-llamacpp-32slots-beside-kv16-epyc-20261127.json",
                           "single_shot through llama.cpp, 32 slots, on the machine of the float16-cache run", "EPYC",
                           ("llamacpp",)),
    "hidden": Sweep("fullsize-single_shot-hidden-epyc-bf16-20261125.json", "single_shot, protocol `hidden`, bf16",
                    "EPYC", ("protocols",)),
    "hidden_check": Sweep('fullsize-hidden-selfcheck-epyc-20261127.json',
                          "single_shot, protocol `hidden`, 3 candidates a round, `self_check: 2`", "EPYC",
                          ("protocols",)),
    "hidden_own": Sweep("fullsize-hidden-owntests-epyc-20261127.json",
                        "single_shot, protocol `hidden`, 3 candidates a round, its own 6 assertions (`self_tests: 6`, "
                        "`self_check: 1`)", "EPYC", ("protocols",)),
    "hidden_own5": Sweep("fullsize-hidden-owntests-k5-epyc-20261127.json",
                         "single_shot, protocol `hidden`, 5 candidates a round, its own 6 assertions (`self_tests: 6`, "
                         "`self_check: 1`)", "EPYC", ("protocols",)),
    "hidden_own5_live": Sweep("fullsize-hidden-owntests-k5-live-epyc-20261127.json",
                              "single_shot, protocol `hidden`, 5 candidates a round, its own 6 assertions "
                              "(`self_tests: 6`, `self_check: 1`, `self_tests_pass: 0`)", "EPYC", ("protocols",)),
    "docs": Sweep("fullsize-single_shot-docs-epyc-fp32-20261125.json", "single_shot, protocol `docs`", "EPYC",
                  ("protocols",), no_wall="stopped and resumed: wall_s covers the resumed part only"),
    "small": Sweep("fullsize-single_shot-0.5b-budgets-epyc-20261126.json", "0.5B single_shot, bf16 (as it ships)",
                   "EPYC", ("small",)),
    "small_fp32": Sweep("fullsize-single_shot-0.5b-epyc-fp32-20261126.json", "0.5B single_shot, fp32, 32 rows",
                        "EPYC", ("small",)),
    "small_k2": Sweep("fullsize-single_shot-k2-0.5b-epyc-fp32-20261126.json",
                      "0.5B single_shot, 2 candidates a round, fp32, 32 rows", "EPYC", ("small",)),
    "small_early": Sweep("fullsize-single_shot-0.5b-epyc-bf16-20261125.json",
                         "0.5B single_shot, bf16, an earlier sweep over `iters=0,1`",
                         "EPYC", ("small",)),
}


@dataclass(frozen=True)
class Pair:
    """Two runs on the tasks both have: SWEEPS key and budget of the one with the technique, then the one without."""
    label: str
    a: tuple[str, int]
    b: tuple[str, int]
    table: str  # techniques, protocols, small, llamacpp, noise


PAIRS: list[Pair] = [
    Pair("3 more rounds (fresh tries) vs none, single_shot", ("default", 3), ("default", 0), "techniques"),
    Pair("3 more rounds vs none, 2 candidates a round", ("k2", 3), ("k2", 0), "techniques"),
    Pair("2 candidates a round vs 1, 3 rounds", ("k2", 3), ("default", 3), "techniques"),
    Pair("2 candidates for 2 rounds vs 1 for 4 rounds (about equal tokens)", ("k2", 1), ("default", 3), "techniques"),
    Pair("reflection vs single_shot, 3 rounds", ("reflection", 3), ("default", 3), "techniques"),
    Pair("reflection vs single_shot, 1 round", ("reflection", 1), ("default", 1), "techniques"),
    Pair("reflection vs 2 candidates a round, 3 rounds", ("reflection", 3), ("k2", 3), "techniques"),
    Pair("reflection vs react, 3 rounds", ("reflection", 3), ("react", 3), "techniques"),
    Pair("react vs single_shot, 3 rounds", ("react", 3), ("default", 3), "techniques"),
    Pair("react's defaults vs 12 turns without rewrite (the tasks the stopped run finished)", ("react", 3),
         ("react_12", 3), "techniques"),
    Pair("16 answers vs 8, single_shot's answer stream", ("stream16", 15), ("grid_k1", 7), "techniques"),
    Pair("same job, two commits with result-neutral speed changes", ("default", 3), ("default_grouped", 3), "noise"),
    Pair("same job, bf16 vs fp32 beside the int8 weights", ("default_bf16", 3), ("default", 3), "noise"),
    Pair("same job, float16 KV cache and compiled int8 loops vs the float32 cache (two days and many speed changes "
         "apart)", ("default_kv16", 3), ("default", 3), "noise"),
    Pair("same job, decode attention with fused multiply-adds vs without (the only change that moves numbers)",
         ("default_fma", 3), ("default_kv16", 3), "noise"),
    Pair("same job, the path measured on a Xeon with AMX (fixlab's VNNI kernel up to 16 rows, torch._int_mm above: the "
         "same int8 values) vs the EPYC's torch._int_mm", ("default_paths", 3), ("default_fma", 3), "noise"),
    Pair("same job, the same Xeon held to AVX2 (fixlab's AVX2 int8 kernel and decode attention) vs its own path",
         ("default_paths_avx2", 3), ("default_paths", 3), "noise"),
    Pair("`hidden` vs `tests`, 3 rounds (both bf16)", ("hidden", 3), ("default_bf16", 3), "protocols"),
    Pair("`docs` vs `tests`, 3 rounds (both fp32)", ("docs", 3), ("default", 3), "protocols"),
    Pair("`hidden`: 3 candidates with the self-check, 1 round, vs 1 candidate, 4 rounds", ("hidden_check", 0),
         ("hidden", 3), "protocols"),
    Pair("`hidden`: 3 candidates a round with their own assertions, 2 rounds, vs 1 candidate, 4 rounds",
         ("hidden_own", 1), ("hidden", 3), "protocols"),
    Pair("`hidden`: 3 candidates with their own assertions, 2 rounds, vs with the self-check, 1 round",
         ("hidden_own", 1), ("hidden_check", 0), "protocols"),
    Pair("`hidden`: 5 candidates a round with their own assertions vs 3, 2 rounds", ("hidden_own5", 1),
         ("hidden_own", 1), "protocols"),
    Pair("`hidden`, 5 candidates with own assertions, 3 rounds: the same command run twice (today's agent vs the run "
         "before the label knob)", ("hidden_own5_live", 2), ("hidden_own5", 2), "protocols"),
    Pair("1.5B vs 0.5B, single_shot, 3 rounds", ("default", 3), ("small", 3), "small"),
    Pair("0.5B: 2 candidates a round vs 1 (both fp32, 32 rows)", ("small_k2", 3), ("small_fp32", 3), "small"),
    Pair("0.5B: fp32 with 32 rows vs bf16 with 16", ("small_fp32", 3), ("small", 3), "small"),
    Pair("llama.cpp vs fixlab's engine, single_shot, 3 rounds", ("llamacpp", 3), ("default", 3), "llamacpp"),
    Pair("llama.cpp vs the engine with compiled loops and float16 KV cache, same machine, 3 rounds", ("llamacpp_kv16", 3),
         ("default_kv16", 3), "llamacpp"),
    Pair("llama.cpp vs the engine with the register-blocked decode attention, same machine, 3 rounds",
         ("llamacpp_kv16", 3), ("default_fma", 3), "llamacpp"),
]

# Speed benchmarks: kind -> files, one line each (kinds: weights, generation, endtoend, sandbox, sweep_cache, drafts,
# forward, decode_profile, attention, int8_matmul, memory, paths).
SPEED: list[tuple[str, str]] = [
    ("weights", "weights-20261125T093920Z.json"),
    ("weights", "weights-20261125T094443Z.json"),
    ("weights", "weights-20261125T113202Z.json"),
    ("weights", "weights-20261125T151115Z.json"),
    ("weights", "weights-20261125T172314Z.json"),
    ("weights", "weights-20261127T033700Z.json"),
    ("weights", "weights-20261127T180814Z.json"),
    ("weights", "weights-20261127T191023Z.json"),
    ("weights", "weights-20261127T213249Z.json"),
    ("weights", "weights-20261128T000129Z.json"),
    ("weights", "weights-20261128T050431Z.json"),
    ("weights", "weights-20261128T054409Z.json"),
    ("endtoend", "endtoend-reflection-20261125T113857Z.json"),
    ("endtoend", "endtoend-single_shot-20261126T014247Z.json"),
    ("endtoend", "endtoend-single_shot-20261126T013001Z.json"),
    ("endtoend", "endtoend-react-20261126T025902Z.json"),
    ("endtoend", "endtoend-single_shot-20261127T040706Z.json"),
    ("endtoend", "endtoend-single_shot-20261127T082100Z.json"),
    ("endtoend", "endtoend-single_shot-20261127T100907Z.json"),
    ("endtoend", "endtoend-single_shot-20261127T192300Z.json"),
    ("endtoend", "endtoend-reflection-20261127T193926Z.json"),
    ("endtoend", "endtoend-react-20261127T220800Z.json"),
    ("endtoend", "endtoend-react-20261128T003442Z.json"),
    ("endtoend", "endtoend-single_shot-20261128T004448Z.json"),
    ("endtoend", "endtoend-reflection-20261128T005728Z.json"),
    ("generation", "generation-cpu-20261122-053032.json"),
    ("generation", "generation-cpu-20261122-055229.json"),
    ("generation", "generation-cpu-20261122-060607.json"),
    ("generation_gpu", "generation-cuda-bf16-20261127T020827Z.json"),
    ("generation_gpu", "generation-cuda-fp32-20261127T020827Z.json"),
    ("sandbox", "sandbox-20261122T045625Z.json"),
    ("sandbox", "sandbox-20261122T050819Z.json"),
    ("sandbox", "sandbox-20261126T171051Z.json"),
    ("sweep_cache", "sweep.json"),
    ("decode_profile", "decode-profile-20261126T182131Z.json"),
    ("decode_profile", "decode-profile-20261127T024424Z.json"),
    ("decode_profile", "decode-profile-20261127T024756Z-prefill896.json"),
    ("decode_profile", "decode-profile-20261127T025044Z-prefill2048.json"),
    ("decode_profile", "decode-profile-20261127T041833Z.json"),
    ("decode_profile", "decode-profile-20261127T190040Z-before-eager-kv32.json"),
    ("decode_profile", "decode-profile-20261127T190227Z-after-native-kv16.json"),
    ("decode_profile", "decode-profile-20261128T001528Z-before-fma-attention-0995f0a.json"),
    ("decode_profile", "decode-profile-20261128T001644Z-after-fma-attention.json"),
    ("attention", "attention-20261128T001409Z.json"),
    ("int8_matmul", "int8-matmul-20261128T012540Z.json"),
    ("memory", "memory-20261126T171409Z-after-int8.json"),
    ("memory", "memory-20261126T174015Z-series-int8.json"),
    ("memory", "memory-20261126T182944Z-trim.json"),
    ("memory", "memory-20261126T190738Z-iters1-new.json"),
    ("memory", "memory-20261126T191709Z-iters1-prefix1024.json"),
    ("memory", "memory-20261126T205331Z-fullsize-default.json"),
    ("memory", "memory-20261126T213416Z-ab-trim-on-kv1536-prefill2048.json"),
    ("memory", "memory-20261126T213836Z-ab-trim-off-nokv-prefill8192.json"),
    ("memory", "memory-20261126T225444Z-rerun-defaults.json"),
    ("memory", "memory-20261126T230035Z-rerun-defaults.json"),
    ("memory", "memory-20261126T230550Z-mmap-threshold-1mib.json"),
    ("memory", "memory-20261126T234117Z-fullsize-default-mmap4mib.json"),
    ("memory", "memory-20261127T003619Z-fullsize-default-int8head-prefill32.json"),
    ("memory", "memory-20261127T012145Z-int8head-prefill-forward32.json"),
    ("memory", "memory-20261127T020331Z-fullsize-default-final.json"),
    ("memory", "memory-20261127T025115Z-fullsize-prefill896.json"),
    ("memory", "memory-20261127T090825Z-fullsize-drafts.json"),
    ("memory", "memory-20261127T180944Z-fullsize-native.json"),
    ("memory", "memory-20261127T182831Z-fullsize-native-kv16.json"),
    ("memory", "memory-20261127T184148Z-fullsize-eager-kv32.json"),
    ("memory", "memory-20261127T193927Z-fullsize-64rows.json"),
    ("memory", "memory-20261127T213250Z-fullsize-llamacpp-32slots.json"),
    ("memory", "memory-20261128T000210Z-fullsize-attn-fma.json"),
    ("memory", "memory-20261128T051027Z-fullsize-paths-native.json"),
    ("memory", "memory-20261128T054410Z-fullsize-paths-forced-avx2.json"),
    ("paths", "paths-20261128T061654Z.json"),
    ("drafts", "drafts-20261127T095125Z.json"),
    ("forward", "forward-20261127T101425Z.json"),
]

# The README's speed paragraph: the newest job, decode and path figures (each file also has its row in SPEED; the
# rest of speed, drafts, 30-task jobs, the GPU, is docs/RESULTS.md section 7).
SPEED_HEADLINE = {"job": "memory-20261128T051027Z-fullsize-paths-native.json",  # make eval's job, all tasks
                  "decode": "weights-20261128T050431Z.json",  # benchmarks/weights.py at 32 rows, beside 1cc9ea3's
                  "paths": "paths-20261128T061654Z.json",  # benchmarks/paths.py: the chooser's calibration
                  # make eval's model as it resolves (the measured path) beside llama.cpp, 32 rows x 700 tokens
                  "default_vs_llamacpp": "weights-20261128T050431Z.json",
                  "default_vs_llamacpp_avx2": "weights-20261128T054409Z.json"}  # the same, held to AVX2  # the same, held to AVX2

# Harness checks through a sandbox backend: the oracle doubles (model=canonical / model=buggy) on every task.
HARNESS: list[str] = ["fullsize-canonical-buggy-docker-epyc-20261126.json"]


# ---------------------------------------------------------------------------------------------------------------
# Reading the files
# ---------------------------------------------------------------------------------------------------------------
class ReportError(Exception):
    """One line for the user: what is wrong and how to fix it."""


@dataclass
class Run:
    run_id: str
    iters: int
    by_round: list[int]  # tasks passed after each round
    total: int
    outcomes: dict[str, int | None] | None  # task#sample -> first passing round (None: never); None: not recorded
    cost: dict
    tuning: tuple[int, int] | None = None  # (passed, total) on Python/0-23
    other: tuple[int, int] | None = None
    by_bug: dict[str, tuple[int, int]] = field(default_factory=dict)
    overfit: dict | None = None
    index: int = 0  # position in the file's runs (its `paired` list is each run against the first)
    params: dict = field(default_factory=dict)  # the run's resolved config, flattened
    cost_by_round: list[dict] | None = None  # the cost after each round, summed over tasks (when recorded)

    def cut(self, iters: int) -> "Run":
        """This run as a budget-`iters` run would have been: round r never depends on the budget (agents/loop.py),
        so the outcomes after round `iters` and the cost up to it are that run's."""
        if self.outcomes is None or not self.cost_by_round or not 0 <= iters <= self.iters:
            raise ReportError(f"run {self.short} cannot be cut to iters={iters}: it keeps no per-round outcomes and "
                              "costs; record it again with benchmarks/fullsize.py")
        cost = {k: v for k, v in self.cost_by_round[iters].items() if k != "task_seconds"}
        return replace(self, iters=iters, by_round=self.by_round[:iters + 1], cost=cost, overfit=None,
                       outcomes={t: r if r is not None and r <= iters else None for t, r in self.outcomes.items()})

    @property
    def passed(self) -> int:
        return self.by_round[-1]

    @property
    def short(self) -> str:
        return self.run_id[:8]


@dataclass
class LoadedSweep:
    key: str
    spec: Sweep
    runs: list[Run]  # by budget
    command: str
    stored_pairs: list[dict]

    def at(self, iters: int) -> Run:
        for r in self.runs:
            if r.iters == iters:
                return r
        if self.last.iters > iters and self.last.cost_by_round:  # a budget the sweep did not run on its own
            return self.last.cut(iters)
        raise ReportError(f"{self.spec.file} has no run at iters={iters} (flows/report.py PAIRS names it)")

    @property
    def last(self) -> Run:
        return self.runs[-1]

    @property
    def wall_s(self) -> float | None:
        if self.spec.no_wall:
            return None
        walls = [r.cost.get("wall_s") for r in self.runs]
        return sum(walls) if all(isinstance(w, (int, float)) for w in walls) else None


def _read(results: Path, name: str) -> dict:
    path = results / name
    if not path.exists():
        raise ReportError(f"{path} is missing but flows/report.py lists it: restore it or drop its line there")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ReportError(f"{path} is not valid JSON ({e.msg}, line {e.lineno})") from None


@contextmanager
def reading(name: str):
    """A results file whose shape is not what its table reads is one line naming it, not a traceback."""
    try:
        yield
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as e:
        raise ReportError(f"benchmarks/results/{name} lacks what its table reads ({type(e).__name__}: {e}); record it "
                          "again with the script that wrote it, or fix its line in flows/report.py") from None


def _fraction(text: str) -> tuple[int, int]:
    a, b = text.split("/")
    return int(a), int(b)


def load_sweep(results: Path, key: str, spec: Sweep) -> LoadedSweep:
    data = _read(results, spec.file)
    with reading(spec.file):
        return _sweep_from(data, key, spec)


def _sweep_from(data: dict, key: str, spec: Sweep) -> LoadedSweep:
    if "runs" not in data:  # the older shape (full-default-*.json): one stopped run, counts as text
        cost = {k: data[k] for k in ("prompt_tokens", "prefill_tokens", "completion_tokens", "model_calls",
                                     "sandbox_runs") if k in data}
        run = Run(data["run_id"], len(data["passed_by_round"]) - 1, list(data["passed_by_round"]),
                  data["total_tasks"], None, cost, _fraction(data["tuning_sample_Python_0_23"]),
                  _fraction(data["rest_Python_24_163"]),
                  {b: _fraction(v) for b, v in data.get("by_bug_type", {}).items()})
        return LoadedSweep(key, spec, [run], data.get("command", ""), [])
    runs = []
    for i, r in enumerate(data["runs"]):
        if spec.strategy and r["params"].get("strategy.name") != spec.strategy:
            continue
        if spec.candidates and int(r["params"].get("strategy.candidates", 1)) != spec.candidates:
            continue
        fpr = r.get("first_pass_round")
        runs.append(Run(
            r["run_id"], int(r["params"].get("iters", len(r["by_round"]) - 1)), [x["passed"] for x in r["by_round"]],
            r["overall"]["total"], fpr if fpr else None, r.get("cost", {}),
            (r["tuning_sample_0_23"]["passed"], r["tuning_sample_0_23"]["total"]),
            (r["other_tasks"]["passed"], r["other_tasks"]["total"]),
            {b: (v["passed"], v["total"]) for b, v in r.get("by_bug_type", {}).items()}, r.get("overfit_gap"), i,
            r["params"], r.get("cost_by_round")))
    if not runs:
        raise ReportError(f"{spec.file} has no runs for the row {key!r} in flows/report.py")
    return LoadedSweep(key, spec, sorted(runs, key=lambda r: r.iters), data.get("command", ""), data.get("paired", []))


def load_all(results: Path) -> dict[str, LoadedSweep]:
    return {k: load_sweep(results, k, s) for k, s in SWEEPS.items()}


def registered() -> set[str]:
    return {s.file for s in SWEEPS.values()} | {f for _, f in SPEED} | set(HARNESS)


def unlisted(results: Path) -> list[str]:
    """Results files that no table names (each should get a line in the registry)."""
    return sorted(p.name for p in results.glob("*.json") if p.name not in registered())


# ---------------------------------------------------------------------------------------------------------------
# Figures
# ---------------------------------------------------------------------------------------------------------------
def pass_ci(passed: int, total: int) -> str:
    lo, hi = wilson(passed, total)
    return f"{lo:.3f}-{hi:.3f}"


def rate(passed: int, total: int) -> str:
    return f"{passed / total:.3f}" if total else "-"


def tok(n: float | None) -> str:
    return "-" if n is None else f"{n / 1000:.1f}k"


def minutes(s: float | None) -> str:
    return "-" if s is None else f"{s / 60:.1f} min"


def pval(p: float) -> str:
    if p >= 0.01:
        return f"{p:.2f}"
    if p >= 0.001:
        return f"{p:.3f}"
    return f"{p:.0e}"


def points(x: float) -> str:
    return f"{x * 100:+.1f}"


def link(name: str) -> str:
    return f"[{name}](../benchmarks/results/{name})"


WIDTH = 116


def wrap(text: str) -> str:
    """Prose at the repo's line width (tables stay one row a line)."""
    return textwrap.fill(text, WIDTH, break_long_words=False, break_on_hyphens=False)


def table(head: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return out


def command_of(sw: LoadedSweep) -> str:
    """The sweep's flows.evaluate command as the file records it, without its notes or a private cache_dir."""
    m = re.match(r"(python -m flows\.evaluate\s.*?\s-m)(\s|$)", sw.command)
    if not m:
        return ""
    return " ".join(t for t in m.group(1).split() if not t.startswith("cache_dir="))


@dataclass
class PairResult:
    a: Run
    b: Run
    result: Paired
    per_round: list[Paired] | None  # after each round, when both runs have outcomes and the same budget


def pair_runs(a: Run, b: Run) -> PairResult | None:
    if a.outcomes is None or b.outcomes is None:
        return None
    keys = sorted(set(a.outcomes) & set(b.outcomes))

    def ok(run: Run, k: int | None) -> list[bool]:
        return [run.outcomes[t] is not None and (k is None or run.outcomes[t] <= k) for t in keys]

    per_round = [paired(ok(a, k), ok(b, k)) for k in range(a.iters + 1)] if a.iters == b.iters else None
    return PairResult(a, b, paired(ok(a, None), ok(b, None)), per_round)


def stored_budget_pair(sw: LoadedSweep) -> Paired | None:
    """A file recorded without per-task outcomes keeps its pairings (each run against its first): the discordant
    counts there and the two runs' totals give the whole 2x2 table, so the test is recomputed exactly from them (the
    file's own p-values are rounded to 6 places)."""
    first, last = sw.runs[0], sw.last
    if first.index != 0 or last.index == 0 or len(sw.stored_pairs) < last.index:
        return None
    s = sw.stored_pairs[last.index - 1]
    n, only_a, only_b = first.total, s["only_a"], s["only_b"]
    both = last.passed - only_a
    if both != first.passed - only_b or min(both, n - both - only_a - only_b) < 0:
        raise ReportError(f"{sw.spec.file}: its paired counts do not fit its runs' totals; record it again with "
                          "benchmarks/fullsize.py")
    neither = n - both - only_a - only_b
    a = [True] * (both + only_a) + [False] * (only_b + neither)
    b = [True] * both + [False] * only_a + [True] * only_b + [False] * neither
    return paired(a, b)


def budget_pair(sw: LoadedSweep) -> Paired | None:
    if len(sw.runs) < 2:  # one run of the largest budget: against its own round 0, when it keeps per-round costs
        return pair_runs(sw.last, sw.last.cut(0)).result if sw.last.iters and sw.last.cost_by_round else None
    pr = pair_runs(sw.last, sw.runs[0])
    return pr.result if pr else stored_budget_pair(sw)


ALPHA = 0.05  # the level at which a paired difference is called a verdict (as flows.stats.Paired.verdict)


def verdict_word(p: Paired) -> str:
    if p.p_value >= ALPHA:
        return "no verdict"
    return "better" if p.diff > 0 else "worse"


def run_ids(sw: LoadedSweep) -> str:
    return " / ".join(r.short for r in sw.runs)


# ---------------------------------------------------------------------------------------------------------------
# Sections
# ---------------------------------------------------------------------------------------------------------------
ROUNDS = 4  # columns r0..r3: the sweeps here go to iters=3


def curve_cells(run: Run) -> list[str]:
    cells = [rate(p, run.total) for p in run.by_round[:ROUNDS]]
    return cells + [""] * (ROUNDS - len(cells))


def sweep_rows(sweeps: list[LoadedSweep], extra=None) -> list[list[str]]:
    rows = []
    for sw in sweeps:
        r = sw.last
        c = r.cost
        cells = [sw.spec.label, sw.spec.machine, *curve_cells(r), f"{r.passed} / {r.total}", pass_ci(r.passed, r.total)]
        if extra:
            cells += extra(sw)
        cells += [f"{tok(c.get('prompt_tokens'))} / {tok(c.get('prefill_tokens'))} / {tok(c.get('completion_tokens'))}",
                  f"{c['model_calls']:.0f}" if "model_calls" in c else "-",
                  f"{c['sandbox_runs']:.0f}" if "sandbox_runs" in c else "-",
                  minutes(sw.wall_s), run_ids(sw), link(sw.spec.file)]
        rows.append(cells)
    return rows


SWEEP_HEAD_START = ["configuration", "machine", "r0", "r1", "r2", "r3", "passed", "95% CI"]
SWEEP_HEAD_END = ["tokens sent / prefilled / completion", "model calls", "sandbox runs", "sweep wall",
                  "MLflow runs (iters=0/1/2/3)", "results file"]


def pair_table(results: list[tuple[Pair, PairResult]]) -> list[str]:
    rows = []
    for pair, pr in results:
        p = pr.result
        per_round = ("" if pr.per_round is None else
                     " / ".join(points(x.diff) + ("*" if x.p_value < ALPHA else "") for x in pr.per_round))
        ca, cb = pr.a.cost, pr.b.cost
        rows.append([pair.label, f"{p.a_passed} / {p.n}", f"{p.b_passed} / {p.n}",
                     f"**{points(p.diff)}** ({points(p.low)} to {points(p.high)})", f"{p.only_a} / {p.only_b}",
                     pval(p.p_value), verdict_word(p), per_round,
                     f"{tok(ca.get('prompt_tokens'))} / {tok(ca.get('completion_tokens'))} vs "
                     f"{tok(cb.get('prompt_tokens'))} / {tok(cb.get('completion_tokens'))}",
                     f"{pr.a.short} vs {pr.b.short}: {SWEEPS[pair.a[0]].file} vs {SWEEPS[pair.b[0]].file}"])
    return table(["with vs without", "with", "without", "difference, points (95% CI)", "fixed by one only",
                  "p", "verdict", f"per round (* p < {ALPHA})", "tokens sent / completion", "MLflow runs: results files"],
                 rows)


def pairs_for(sweeps: dict[str, LoadedSweep], table_name: str) -> list[tuple[Pair, PairResult]]:
    out = []
    for pair in PAIRS:
        if pair.table != table_name:
            continue
        pr = pair_runs(sweeps[pair.a[0]].at(pair.a[1]), sweeps[pair.b[0]].at(pair.b[1]))
        if pr is None:
            raise ReportError(f"pair {pair.label!r}: a run has no per-task outcomes; record it again with "
                              "benchmarks/fullsize.py")
        out.append((pair, pr))
    return out


def rounds(iters: int) -> str:
    """A budget in words: feedback rounds after round 0."""
    return f"{iters} round{'' if iters == 1 else 's'}"


def tagged(sweeps: dict[str, LoadedSweep], tag: str) -> list[LoadedSweep]:
    return [sw for sw in sweeps.values() if tag in sw.spec.tables]


def best_and_default(sweeps: dict[str, LoadedSweep]) -> tuple[LoadedSweep, LoadedSweep]:
    """The best configuration: most tasks passed by a strategies row that ran every task; the default: `make eval`'s."""
    rows = tagged(sweeps, "strategies") + tagged(sweeps, "grid")
    full = max(sw.last.total for sw in rows)
    # most tasks passed; between equals, the fewest completion tokens (a grid holds several points at one pass@1)
    best = max((sw for sw in rows if sw.last.total == full),
               key=lambda sw: (sw.last.passed, -(sw.last.cost.get("completion_tokens") or float("inf"))))
    return best, sweeps["default"]


def budget_verdicts(sweeps: list[LoadedSweep]) -> list[str]:
    lines = []
    for sw in sweeps:
        p = budget_pair(sw)
        if p is None:
            continue
        a, b = f"iters={sw.last.iters}", f"iters={sw.runs[0].iters if len(sw.runs) > 1 else 0}"
        lines.append(f"- {sw.spec.label} ({sw.spec.machine}): {p.verdict(a, b)}.")
    return lines


def best_hidden(sweeps: dict[str, LoadedSweep]) -> LoadedSweep | None:
    """The protocol `hidden` sweep whose last run passed the most tasks under the verdict (the 1.5B pack's)."""
    rows = [sw for sw in tagged(sweeps, "protocols") if sw.last.params.get("protocol") == "hidden" and sw.last.overfit]
    return max(rows, key=lambda sw: (sw.last.passed, -sw.last.overfit["gap"])) if rows else None


def hidden_sentence(sw: LoadedSweep) -> str:
    r, g = sw.last, sw.last.overfit
    return (f"Under protocol `hidden` (the agent sees the docstring's examples; the full test is never shown) the best "
            f"is {sw.spec.label}, {rounds(r.iters)}: pass@1 {rate(r.passed, r.total)} ({r.passed}/{r.total}, "
            f"{pass_ci(r.passed, r.total)}) with an overfit gap of {points(g['gap'])} points "
            f"({points(g['ci95'][0])} to {points(g['ci95'][1])}): it stopped satisfied with "
            f"{g.get('satisfied', g['visible_passed'])} answers, {g['visible_only']} of them rejected by the full test "
            f"(run {r.short})." + (f" {default_pass_words(g['at_default_pass'])}" if "at_default_pass" in g else ""))


def default_pass_words(w: dict) -> str:
    """A run's labels read back at today's `self_tests_pass` (benchmarks/fullsize.py at_own_tests_pass)."""
    return (f"Labelled by today's rule (`self_tests_pass: {w['share']:g}`, chosen on Python/0-23; the rule never "
            f"changes an answer, so this is read back exactly) it is satisfied with {w['satisfied']}, "
            f"{w['satisfied_but_rejected']} of them rejected by the full test: a gap of {points(w['gap'])} points "
            f"({points(w['ci95'][0])} to {points(w['ci95'][1])}).")


def headline_block(sweeps: dict[str, LoadedSweep], in_readme: bool = True, frontier_words: str = "") -> str:
    best, default = best_and_default(sweeps)
    b, d = best.last, default.last
    first = (f"**Best measured: {best.spec.label}, {rounds(b.iters)}: pass@1 {rate(b.passed, b.total)} "
             f"({b.passed}/{b.total} tasks, 95% Wilson interval {pass_ci(b.passed, b.total)}).** Every HumanEvalFix "
             f"task, 1.5B pack, protocol `tests`, on a {MACHINES[best.spec.machine]}: `{command_of(best)}`.")
    if b.tuning:
        first += (f" The tuning sample (Python/0-23, where prompts and knobs were shaped) is {b.tuning[0]}/{b.tuning[1]} "
                  f"of it; the other {b.other[1]} tasks score {b.other[0]}/{b.other[1]} ({pass_ci(*b.other)}).")
    knobs = ", ".join(f"`{k}={d.params[k]}`" for k in ("strategy.name", "strategy.candidates", "iters") if k in d.params)
    second = (f"`make eval` ({knobs}) scores {rate(d.passed, d.total)} ({d.passed}/{d.total}, "
              f"{pass_ci(d.passed, d.total)}); its sweep over every budget up to {d.iters} took "
              f"{minutes(default.wall_s)} on the same machine.")
    if best is not default:
        pr = pair_runs(b, d)
        if pr:
            second += f" Paired on the same tasks, {pr.result.verdict(best.spec.label, '`make eval`')}."
    hidden = best_hidden(sweeps)
    if hidden is not None:
        second += " " + hidden_sentence(hidden)
    third = (f"Every figure, with its interval, MLflow runs and results file: [docs/RESULTS.md](docs/RESULTS.md), "
             f"generated by `{COMMAND}`.")
    words = f"**The frontier** ({FRONTIER_MODEL}, protocol `{FRONTIER_PROTOCOL}`, picture below): {frontier_words}"
    paras = (first, second) + ((words,) if frontier_words else ()) + ((third,) if in_readme else ())
    return "\n\n".join(wrap(x) for x in paras)


def section_grid(sweeps: dict[str, LoadedSweep]) -> list[str]:
    """single_shot's candidates x budgets grid, cut from one run of its answer stream (flows/stream.py): one row per
    candidates a round, one column per answers a task, pass@1 where the point exists."""
    rows = tagged(sweeps, "grid")
    if not rows:
        return []
    n = max(int(sw.last.params.get("strategy.candidates", 1)) * (sw.last.iters + 1) for sw in rows)
    out = ["## single_shot's grid: candidates a round x rounds, from one run", "",
           "Every point `(candidates=k, iters=r)` spends k(r+1) answers a task; all of them are cut from one run of the "
           "task's answer stream (answer p has round p's seed and temperature), so the grid cost one run of its "
           "largest point. A cell is pass@1 after the answers its column names, with the tasks passed.", ""]
    body = []
    for sw in sorted(rows, key=lambda sw: int(sw.last.params.get("strategy.candidates", 1))):
        r = sw.last
        k = int(r.params.get("strategy.candidates", 1))
        cells = [""] * n
        for rnd, passed in enumerate(r.by_round):
            cells[k * (rnd + 1) - 1] = f"{rate(passed, r.total)} ({passed})"
        body.append([f"{k} a round (iters 0-{r.iters})", *cells, pass_ci(r.passed, r.total),
                     tok(r.cost.get("completion_tokens")), minutes(sw.wall_s), r.run_id[:8], link(sw.spec.file)])
    out += table(["candidates", *[f"{a} answers" for a in range(1, n + 1)], "95% CI (all answers)",
                  "completion tokens", "job wall", "MLflow run", "results file"], body)
    by_answers: dict[int, set[int]] = {}
    for sw in rows:
        k = int(sw.last.params.get("strategy.candidates", 1))
        for rnd, passed in enumerate(sw.last.by_round):
            by_answers.setdefault(k * (rnd + 1), set()).add(passed)
    if len(rows) > 1 and all(len(v) == 1 for v in by_answers.values()):
        out += ["", "Every column agrees across rows: under this protocol a point passes a task when any of its answers "
                "passes the task's tests, so pass@1 depends on the answers spent, not on how they are split into "
                "rounds; more candidates a round only cost more (a passing round's other answers are drafted too)"
                "."]
    walls = [sw.wall_s for sw in rows]
    if all(w is not None for w in walls):
        out += ["", f"The whole grid took {minutes(sum(walls))} of job wall time on a {MACHINES[rows[0].spec.machine]}: "
                f"the job that ran the stream {minutes(max(walls))}, every other job a cut of it."]
    else:
        cuts = [w for w in walls if w is not None]
        out += ["", f"On a {MACHINES[rows[0].spec.machine]}, every job but the stream's is a cut of it: "
                f"{minutes(sum(cuts))} of wall time for the {len(cuts)} cuts together."]
        out += [f"- {sw.spec.label}: no job wall ({sw.spec.no_wall})." for sw in rows if sw.spec.no_wall]
    return out


def section_strategies(sweeps: dict[str, LoadedSweep]) -> list[str]:
    rows = tagged(sweeps, "strategies")
    out = ["## 1. What a strategy and a budget buy (1.5B pack, protocol `tests`)", "",
           "One row per sweep `python -m flows.evaluate strategy=... iters=0,1,2,3 -m` (its exact command is in its "
           "results file): pass@1 after each round of the largest budget, its 95% Wilson interval, that run's cost, "
           "and the wall time of the whole sweep (the sum of its jobs' wall_s; with the trajectory cache the first job "
           "runs every task to the largest budget and the others cut it). A run with more than 3 rounds shows r0-r3, "
           "and `passed` after its last round.", ""]
    out += table(SWEEP_HEAD_START + SWEEP_HEAD_END, sweep_rows(rows))
    notes = [f"- {sw.spec.label}: no sweep wall ({sw.spec.no_wall})." for sw in rows if sw.spec.no_wall]
    out += ["", *notes, "", "The budget inside each sweep, largest against none, paired on the same tasks "
            "(Newcombe 95% interval of the difference; exact McNemar p on the tasks one run fixed and the other did not):",
            ""]
    out += budget_verdicts(rows)
    return out


def section_protocols(sweeps: dict[str, LoadedSweep]) -> list[str]:
    rows = tagged(sweeps, "protocols")

    def seen(sw: LoadedSweep) -> list[str]:
        g = sw.last.overfit
        if not g:
            return ["(= verdict)", "-"]
        sat = g.get("satisfied", g["visible_passed"])
        unsure = f" ({g['visible_passed'] - sat} unsure)" if sat != g["visible_passed"] else ""
        return [f"{g['visible_passed']} / {g['total']}{unsure}",
                f"**{points(g['gap'])}** ({points(g['ci95'][0])} to {points(g['ci95'][1])})"]

    out = ["## 2. What the agent sees: protocols and the overfit gap", "",
           "Under `hidden` the agent sees, and is fed back, only the docstring's examples (`example_test`); under "
           "`docs` the buggy code with its docstring and no tests. The verdict is always the full test, never shown. "
           "The overfit gap is how often the agent stopped satisfied (its final answer passed what it saw and, with "
           "`self_check`, enough of its answers agreed on probe inputs; else it stops unsure) minus how often the "
           "answer passed the verdict, on the same tasks (Newcombe interval).", ""]
    out += table(SWEEP_HEAD_START + ["passed what it saw", "overfit gap, points (95% CI)"] + SWEEP_HEAD_END,
                 sweep_rows(rows, seen))
    notes = [f"- {sw.spec.label}: no sweep wall ({sw.spec.no_wall})." for sw in rows if sw.spec.no_wall]
    out += ["", *notes, "", "Paired:", ""]
    out += pair_table(pairs_for(sweeps, "protocols"))
    checks = [readback_line(sw, "without_self_check", "self_check_vs_none", "with the self-check", "without it")
              for sw in rows if (sw.last.overfit or {}).get("without_self_check")]
    if checks:
        out += ["", "The self-check against none, on the same answers (the round that stopped keeps its first candidate "
                "that passed what the agent saw, read back from the candidates' recorded statuses):", "", *checks]
    own = [readback_line(sw, "without_own_tests", "own_tests_vs_none", "with its own assertions",
                         "by agreement alone") for sw in rows if (sw.last.overfit or {}).get("without_own_tests")]
    if own:
        out += ["", "The model's own assertions (`self_tests`) against agreement alone, on the same answers (the round "
                "that stopped keeps the first answer of its largest group, satisfied when `self_check` answers agree; "
                "read back from the recorded groups):", "", *own]
    today = [f"- {sw.spec.label}, {rounds(sw.last.iters)} (run {sw.last.short}): "
             + default_pass_words(sw.last.overfit["at_default_pass"])
             for sw in rows if (sw.last.overfit or {}).get("at_default_pass")]
    if today:
        out += ["", "Runs judged before `self_tests_pass` (at more than half of the own assertions), labelled by "
                "today's rule:", "", *today]
    out += ["", "The budget under each protocol:", ""]
    out += budget_verdicts([sw for sw in rows if sw.last.params.get("protocol", "tests") != "tests"])
    return out


def readback_line(sw: LoadedSweep, key: str, versus: str, with_it: str, without_it: str) -> str:
    """One run's own answers judged with a technique and, read back from its records, without it (`key` of the
    overfit block; `versus` its paired test)."""
    g = sw.last.overfit
    w, n = g[key], g["total"]
    v = w[versus]
    return (f"- {sw.spec.label}, {rounds(sw.last.iters)}: {with_it} pass@1 {rate(g['hidden_passed'], n)}, satisfied "
            f"{g.get('satisfied', g['visible_passed'])} times, overfit gap {points(g['gap'])}; {without_it} "
            f"{rate(w['hidden_passed'], n)}, satisfied {w['satisfied']} times, gap {points(w['gap'])} "
            f"({points(w['ci95'][0])} to {points(w['ci95'][1])}). With vs without: {points(v['diff'])} points "
            f"({points(v['ci95'][0])} to {points(v['ci95'][1])}; {v['only_with']} vs {v['only_without']} tasks passed by "
            f"one only; exact McNemar p = {pval(v['p_value'])}).")


def section_small(sweeps: dict[str, LoadedSweep]) -> list[str]:
    out = ["## 3. The small model: the 0.5B pack (`model=qwen0.5b-coder-q4`)", "",
           "The same sweeps with the 0.5B pack; the 1.5B default row is repeated for reference.", ""]
    out += table(SWEEP_HEAD_START + SWEEP_HEAD_END, sweep_rows(tagged(sweeps, "small")))
    out += ["", "Paired:", ""]
    out += pair_table(pairs_for(sweeps, "small"))
    out += ["", "The budget inside each 0.5B sweep:", ""]
    out += budget_verdicts([sw for sw in tagged(sweeps, "small") if sw.key != "default"])
    return out


def section_bug_types(sweeps: dict[str, LoadedSweep]) -> list[str]:
    best, default = best_and_default(sweeps)
    cols = [best] + [sw for sw in tagged(sweeps, "bug_types") if sw is not best]
    bugs = sorted(set().union(*(sw.last.by_bug for sw in cols)))
    head, rows = ["bug type", "tasks"], []
    for sw in cols:
        head += [f"{sw.spec.label}: round 0", "after the last round", "95% CI"]
    for bug in bugs:
        total = cols[0].last.by_bug[bug][1]
        row = [bug, str(total)]
        for sw in cols:
            first = sw.runs[0].by_bug.get(bug, (0, 0))
            p, n = sw.last.by_bug.get(bug, (0, 0))
            row += [str(first[0]), f"{p} ({rate(p, n)})", pass_ci(p, n)]
        rows.append(row)
    files = ", ".join(f"{link(sw.spec.file)} ({sw.runs[0].short}, {sw.last.short})" for sw in cols)
    return ["## 4. By bug type: the best configuration and the default", "",
            "Tasks passed per HumanEvalFix bug type at round 0 and after the last round (intervals are wide: a few "
            "dozen tasks a type).", "", *table(head, rows), "", f"From {files}."]


def section_techniques(sweeps: dict[str, LoadedSweep]) -> list[str]:
    return ["## 5. What each technique buys (paired on the same tasks)", "",
            "Each row is two runs on the tasks both have: tasks passed with and without the technique, the difference "
            "with its Newcombe 95% interval, the tasks only one of them fixed, the exact McNemar p on those, and the "
            "difference after each round where both ran the same budget. The knobs were shaped on the tuning sample; "
            "these full-size runs only measure.", "",
            *pair_table(pairs_for(sweeps, "techniques")), "",
            "How far two runs of the same job move (greedy answers are not bit-stable across batch shapes):", "",
            *pair_table(pairs_for(sweeps, "noise"))]


def section_tuning(sweeps: dict[str, LoadedSweep]) -> list[str]:
    rows = []
    for sw in sweeps.values():
        r = sw.last
        if not r.tuning:
            continue
        rows.append([sw.spec.label, sw.spec.machine, f"{r.tuning[0]} / {r.tuning[1]} ({rate(*r.tuning)})",
                     f"{r.other[0]} / {r.other[1]} ({rate(*r.other)})", pass_ci(*r.other), r.short, link(sw.spec.file)])
    return ["## 6. Tuning sample (Python/0-23) against the other tasks", "",
            "Prompts and knobs were shaped on the tuning sample, so its figures are not the product's number: each "
            "full-size run split into the tuning sample and the other tasks (largest budget).", "",
            *table(["configuration", "machine", "tuning sample", "other tasks", "other tasks 95% CI", "MLflow run",
                    "results file"], rows)]


def _machine(data: dict) -> str:
    """The CPU a file's figures come from, with its kernel family and any instruction set forced on it."""
    m = data.get("machine") or data.get("meta") or {}
    if isinstance(m, str):
        return m
    cpu = m.get("cpu", "CPU not recorded")
    out = cpu + (f", {m['cpus']} cores" if "cpus" in m else f", {m['threads']} threads" if "threads" in m else "")
    if m.get("cpu_family"):
        out += f", {m['cpu_family']}"
    if m.get("forced"):
        out += " (forced: " + " ".join(f"{k}={v}" for k, v in m["forced"].items()) + ")"
    return out


def family(data: dict) -> str:
    """The kernel family of the CPU a file's figures come from (agents/serving/machine.py isa_family); files from
    before flags were recorded ran on the AVX-512 VNNI machines that MACHINES names."""
    m = data.get("machine") or data.get("meta") or {}
    if isinstance(m, dict) and m.get("cpu_family"):
        return m["cpu_family"] + (" as avx2 (forced)" if (m.get("forced") or {}).get("FIXLAB_CPU_ISA") == "avx2"
                                  else "")
    return "avx512-vnni (before flags were recorded)"


def speed_families(results: Path) -> list[str]:
    """Which speed files come from which CPU family: figures compare within a family."""
    by: dict[str, list[str]] = {}
    for kind, name in SPEED:
        if name.endswith(".json"):
            with reading(name):
                d = _read(results, name)
            if kind == "paths":
                for mode in d["modes"].values():
                    by.setdefault(family(mode), []).append(name)
            else:
                by.setdefault(family(d), []).append(name)
    rows = [[fam, str(len(set(names))), ", ".join(link(n) for n in sorted(set(names))[-3:])]
            for fam, names in sorted(by.items())]
    return ["### Speed by CPU family", "",
            "Kernels differ by instruction set (agents/serving/paths.py chooses among them by measuring the machine), "
            "so speed figures compare within a CPU family. Each table below names the machine of each row.", "",
            *table(["CPU family", "results files", "newest"], rows)]


def speed_paths(results: Path) -> list[str]:
    """benchmarks/paths.py: the chooser's calibration on each machine, and as the CPUs it can stand in for."""
    out = ["### The path chooser's calibration (`benchmarks/paths.py`)", "",
           "The matmuls of one decode step of the 1.5B pack's shapes (weights streamed from memory, as a whole "
           "model's), ms, for every path the CPU can run, at 1-512 rows (tokens); and what `weights: auto` and "
           "`int8_kernel: auto` take. A mode other than native holds the CPU to fewer instruction sets (the "
           "environment named): it predicts a CPU of that family, with this machine's cores.", ""]
    for name, d in speed_files(results, "paths"):
        with reading(name):
            for mode, r in d["modes"].items():
                widths = sorted({int(m) for t in r["matmul_ms"].values() for m in t})
                rows = [[p] + [f"{t[str(m)] if str(m) in t else t.get(m, '-')}" for m in widths]
                        for p, t in r["matmul_ms"].items()]
                out += [f"{link(name)}, mode `{mode}`: {_machine(r)}; chosen: **{r['choice']['label']}**", "",
                        *table(["path"] + [f"{m} rows" for m in widths], rows), ""]
    return out


def speed_files(results: Path, kind: str):
    """(name, data) of each SPEED file of this kind (callers read each under `reading(name)`)."""
    for k, name in SPEED:
        if k == kind:
            yield name, _read(results, name)


def section_speed(sweeps: dict[str, LoadedSweep], results: Path) -> list[str]:
    out = ["## 7. Speed", "", "Timings from benchmark scripts on this project's shared 2-core machines (other jobs "
           "running beside them; the CPU of each is named). Short benchmarks and whole jobs can disagree: a whole "
           "job keeps many rows decoding, a short one spends its time in the tail.", ""]
    for part in (speed_families(results), speed_paths(results), speed_llamacpp(sweeps), speed_endtoend(results),
                 speed_sweeps(sweeps, results), speed_history(sweeps), speed_weights(results), speed_decode_profile(results), speed_attention(results),
                 speed_int8_matmul(results), speed_drafts(results), speed_forward(results),
                 speed_memory(results), speed_generation(results),
                 speed_generation_gpu(results), speed_sandbox(results)):
        out += part + [""]
    return out


# llama.cpp's full default sweep beside the engine's on the same machine: (llama.cpp's SWEEPS key, the engine's), oldest
# first; the README names the last pair whose files are registered.
LLAMACPP_VS: list[tuple[str, str]] = [("llamacpp", "default"), ("llamacpp_kv16", "default_kv16"),
                                       ("llamacpp_kv16", "default_fma")]


def llamacpp_ratios(sweeps: dict[str, LoadedSweep]) -> list[tuple[LoadedSweep, LoadedSweep, float]]:
    """(llama.cpp's sweep, the engine's, llama.cpp's wall over the engine's) for each LLAMACPP_VS pair at hand."""
    out = []
    for a, b in LLAMACPP_VS:
        if a in sweeps and b in sweeps and sweeps[a].wall_s and sweeps[b].wall_s:
            out.append((sweeps[a], sweeps[b], sweeps[a].wall_s / sweeps[b].wall_s))
    return out


def speed_llamacpp(sweeps: dict[str, LoadedSweep]) -> list[str]:
    rows = tagged(sweeps, "llamacpp")
    out = ["### fixlab's engine against llama.cpp on the same GGUF, the whole default sweep", ""]
    out += table(["backend", "machine", "passed (largest budget)", "95% CI", "tokens sent / prefilled / completion",
                  "sweep wall", "completion tokens/s over the sweep", "results file"],
                 [[sw.spec.label, sw.spec.machine, f"{sw.last.passed} / {sw.last.total}",
                   pass_ci(sw.last.passed, sw.last.total),
                   f"{tok(sw.last.cost.get('prompt_tokens'))} / {tok(sw.last.cost.get('prefill_tokens'))} / "
                   f"{tok(sw.last.cost.get('completion_tokens'))}", minutes(sw.wall_s),
                   f"{sw.last.cost['completion_tokens'] / sw.wall_s:.1f}" if sw.wall_s else "-", link(sw.spec.file)]
                  for sw in rows])
    out += [""] + [f"- {a.spec.label} took {ratio:.2f}x the wall time of {b.spec.label} ({link(a.spec.file)}, "
                   f"{link(b.spec.file)})." for a, b, ratio in llamacpp_ratios(sweeps)]
    return out + ["", *pair_table(pairs_for(sweeps, "llamacpp"))]


def speed_endtoend(results: Path) -> list[str]:
    rows = []
    for name, d in speed_files(results, "endtoend"):
        with reading(name):
            for r in d["rows"]:
                tokens = f"{tok(r['prompt_tokens'])} / {tok(r['prefill_tokens'])} / {tok(r['completion_tokens'])}"
                head = [name, d["strategy"], str(d["iters"]), r["row"], _machine(d), str(r["tasks"])]
                if "wall_s" in r:
                    rows.append(head + [f"{r['wall_s']:.0f} s", f"{r['tasks_per_min']:.2f}",
                                        f"{r['passed']} / {r['tasks']} ({pass_ci(r['passed'], r['tasks'])})", tokens,
                                        f"{r['completion_tok_per_s']:.1f}", ""])
                else:  # stopped at its time limit: what it finished
                    rows.append(head + ["-", "-", f"{r['passed_of_finished']} of {r['tasks_finished']} finished", tokens,
                                        "-", r.get("error", "")])
    return ["### End to end on fixed tasks outside the tuning sample (`benchmarks/endtoend.py`)", "",
            "Each row is a real job from a cold start with its own store and no trajectory cache.", "",
            *table(["results file", "strategy", "iters", "backend", "machine", "tasks", "wall", "tasks/min", "passed",
                    "tokens sent / prefilled / completion", "completion tokens/s", "note"], rows)]


def speed_sweeps(sweeps: dict[str, LoadedSweep], results: Path) -> list[str]:
    rows = []
    for sw in sweeps.values():
        if sw.wall_s is None:
            continue
        first, rest = sw.runs[0].cost["wall_s"], sum(r.cost["wall_s"] for r in sw.runs[1:])
        rows.append([sw.spec.label, sw.spec.machine, minutes(first), f"{rest:.0f} s" if rest < 120 else minutes(rest),
                     minutes(sw.wall_s), tok(sw.last.cost.get("completion_tokens")), link(sw.spec.file)])
    out = ["### Sweep wall times", "",
           "With the trajectory cache and `sweep_ahead` the first job of a sweep runs every task to the largest "
           "budget and the later jobs only cut its rounds, so a sweep over budgets costs about one job (the older "
           "sweeps with long later jobs ran before `sweep_ahead`, f3ee04e).", "",
           *table(["sweep", "machine", "first job", "later jobs", "sweep", "completion tokens (largest budget)",
                   "results file"], rows)]
    for name, d in speed_files(results, "sweep_cache"):
        with reading(name):
            out += ["", f"{link(name)}: {d['model']}, {d['strategy']}, {d['tasks']} tasks ({d['machine']}): "
                    f"`iters=3` alone {d['single_iters3_wall_s']:.1f} s, the sweep `iters=0,1,2,3 -m` "
                    f"{d['sweep_0123_wall_s']:.1f} s ({d['ratio']:.2f}x); curves equal: {d['curves_equal']}."]
    return out


def speed_history(sweeps: dict[str, LoadedSweep]) -> list[str]:
    hist = sorted(tagged(sweeps, "speed_history"), key=lambda sw: -(sw.wall_s or 0))  # slowest (oldest) first
    base = hist[0].wall_s if hist else None
    return ["### How the default sweep got faster (same EPYC, `make eval`'s job at every budget)", "",
            "The changes in order; what each one did is in the commit named and in agents/serving/README.md.", "",
            *table(["change", "passed (largest budget)", "sweep wall", "speed-up over the first row", "results file"],
                   [[sw.spec.change, f"{sw.last.passed} / {sw.last.total}", minutes(sw.wall_s),
                     f"{base / sw.wall_s:.2f}x", link(sw.spec.file)] for sw in hist])]


def speed_weights(results: Path) -> list[str]:
    rows = []
    for name, d in speed_files(results, "weights"):
        with reading(name):
            for r in d["rows"]:
                batches = sorted((int(k[5:-6]), v) for k, v in r.items() if k.startswith("batch") and k.endswith("_tok_s"))
                rows.append([name, _machine(d), str(d.get("decode_context", "")),
                             r["weights"] + (f" ({r['path']})" if r.get("path") and r["weights"] == "default" else ""),
                             r["dtype"],
                             "-" if r.get("weight_gib") is None else f"{r['weight_gib']:.2f}", f"{r['prefill_tok_s']:.1f}",
                             " / ".join(f"{v:.1f}" for _, v in batches), " / ".join(str(b) for b, _ in batches)])
    return ["### Prefill and decode tokens/s, 1.5B pack (`benchmarks/weights.py`)", "",
            "Rows of one file ran side by side; a decode context, where given, is the tokens of context each row "
            "decodes at. A row NAME@REV is row NAME of the script as it stood at commit REV (the engine then).", "",
            *table(["results file", "machine", "decode context", "weights", "dtype", "GiB", "prefill tokens/s",
                    "decode tokens/s", "at batch"], rows)]


def speed_generation(results: Path) -> list[str]:
    rows = []
    for name, d in speed_files(results, "generation"):
        with reading(name):
            by_arch: dict[str, list[dict]] = {}
            for r in d["runs"]:
                by_arch.setdefault(r["arch"], []).append(r)
            for arch, rs in by_arch.items():
                alone = [r for r in rs if not r["mode"].startswith("engine")]
                eng = [r for r in rs if r["mode"].startswith("engine")]
                top = max(eng, key=lambda r: r["batch"])
                rows.append([name, arch, str(rs[0].get("layers", "")), d["meta"]["dtype"],
                             f"{alone[0]['decode_tps']:.1f}" if alone else "-",
                             " / ".join(f"{r['decode_tps']:.1f}" for r in eng), " / ".join(str(r["batch"]) for r in eng),
                             f"{top['decode_tps'] / alone[0]['decode_tps']:.1f}x" if alone else "-",
                             "yes" if all(r["exact"] for r in rs) else "no"])
    return ["### The batching engine against one prompt at a time (`benchmarks/generation.py`)", "",
            "Real architectures with random weights (`pack:` rows: the real packs), cut to the layers given, CPU.", "",
            *table(["results file", "architecture", "layers", "dtype", "one at a time: decode tokens/s",
                    "engine: decode tokens/s", "at batch", "largest batch vs one at a time",
                    "greedy output identical batched and alone"], rows)]


def speed_generation_gpu(results: Path) -> list[str]:
    rows, meta = [], None
    for name, d in speed_files(results, "generation_gpu"):
        with reading(name):
            m = meta = d["meta"]
            for r in d["runs"]:
                if "error" in r:
                    rows.append([name, m["dtype"], r["mode"], str(r["batch"]), f"error: {r['error'][:80]}", "-", "-"])
                    continue
                rows.append([name, m["dtype"], r["mode"], str(r["batch"]), f"{r['e2e_tps']:.0f}",
                             f"{r['decode_tps']:.0f}" if r.get("decode_tps") else "-",
                             f"{r['exact_prompts']} (leading tokens {r['agree_prefix'] * 100:.0f}%)"])
    if not rows:
        return []
    return ["### On a GPU: fixlab's engine, `generate` and transformers' continuous batching (`benchmarks/gpu_check.sh`)",
            "", f"The Qwen2.5-Coder-1.5B architecture with random weights, {meta['gpu']} (torch {meta['torch']}, "
            f"transformers {meta.get('transformers', '?')}), prompts of {meta['prompt_len'][0]}-{meta['prompt_len'][1]} "
            "tokens, every request the same number of new tokens (no EOS, so padded `generate` wastes no slots here as "
            "it would on real answers). Greedy answers are compared with one-at-a-time `generate` on the first prompts "
            "(as many as the last column counts): in bf16 random weights give near-ties that batched kernels flip, so float32 is the exactness "
            "check.", "",
            *table(["results file", "dtype", "mode", "batch", "tokens/s (with prefill)", "decode tokens/s",
                    "greedy equal to one at a time"], rows)]


SANDBOX_WAYS = {"a_fresh_interpreter": "local, new interpreter per program",
                "b_warm_fork": "local, warm forked workers (default)",
                "c_docker_container_per_program": "docker, new container per program",
                "d_docker_warm_containers": "docker, warm containers (default)",
                "e_docker_warm_cgroup_parent_root": "docker, warm containers, `cgroup_parent: /`"}


def speed_decode_profile(results: Path) -> list[str]:
    rows = []
    for name, d in speed_files(results, "decode_profile"):
        with reading(name):
            ms, share, pre = d["ms_per_step"], d["share"], d.get("prefill") or {}
            model = d.get("model", {})
            knobs = ", ".join(f"{k}={v}" for k, v in model.items() if k not in PROFILE_FIXED)
            rows.append([name, _machine(d), knobs, str(d["rows"]), str(d["context"]), str(d.get("steps_timed", "-")),
                         f"{d['step_ms']:.0f}", f"{d['decode_tok_s']:.1f}",
                         *(f"{ms[k]:.0f} ({share[k] * 100:.0f}%)" if k in ms else "-" for k in DECODE_PARTS),
                         f"{pre['tok_s']:.0f}" if pre.get("tok_s") else "-",
                         *(f"{pre['ms_per_token'][k]:.2f}" if pre.get("ms_per_token") else "-" for k in PREFILL_PARTS)])
    return ["### Where a decode step and a prefill go (`benchmarks/decode_profile.py`)", "",
            "The default 1.5B pack (int8 decoder matmuls; the lm_head as `int8_skip` says) in fixlab's engine, each "
            "part timed at its Python entry point: decode over the steps after a warm-up, the prefill of the same "
            "prompts per prompt token. `torch._int_mm` is the integer products inside the int8 matmuls (the rest of "
            "them is rounding each input row and scaling the product back).", "",
            *table(["results file", "machine", "settings", "rows", "context", "steps timed", "step ms", "tokens/s",
                    *(f"{k} ms" for k in DECODE_PARTS), "prefill tokens/s",
                    *(f"prefill {k} ms a token" for k in PREFILL_PARTS)], rows)]


def speed_drafts(results: Path) -> list[str]:
    rows = []
    for name, d in speed_files(results, "drafts"):
        with reading(name):
            for r in d["rows"]:
                setting = ", ".join(f"{k}={v}" for k, v in r["setting"].items()) or "defaults"
                rows.append([name, _machine(d), r["row"], setting, f"{r['wall_s']:.0f} ({r['prefill_s']:.0f})",
                             f"{r['decode_tok_s']:.1f}", f"{r['decode_speedup_vs_first']:.2f}",
                             str(r["completion_tokens"]), str(r["steps"]),
                             f"{r['draft_accepted']} / {r['draft_tokens']}", str(r["compactions"]),
                             f"{r['answers_equal_first_row']} / {d['requests']}"])
    return ["### Prompt-lookup drafts at full batch (`benchmarks/drafts.py`)", "",
            "Real repairs decoding together (the tuning sample's first prompts, each sent greedy and with seeded "
            "sampling, answers ending at their closing fence; more requests than rows: the rest join as rows "
            "finish), one engine setting per row over the same loaded model. Answers differ from the first row's only "
            "by float rounding in batched shapes. Copies of one prompt admitted together share a prefill, so the "
            "prefill seconds depend on when rows finish: a job's prompts differ, compare decode.", "",
            *table(["results file", "machine", "row", "setting", "wall s (prefill s)", "decode tokens/s", "x first row",
                    "tokens",
                    "forwards", "drafts kept / proposed", "compactions", "answers equal to the first row's"], rows)]


def speed_forward(results: Path) -> list[str]:
    rows = []
    for name, d in speed_files(results, "forward"):
        with reading(name):
            for r in d["rows"]:
                b, p = r["batched"], r["per_row"]
                rows.append([name, _machine(d), f"{r['rows']} x {r['columns']} x {r['new_tokens']}",
                             f"{r['padding']:.0%}", f"{b['forward_ms']:.0f} ({b['attention_ms']:.0f})",
                             f"{p['forward_ms']:.0f} ({p['attention_ms']:.0f})", f"{r['speedup']:.2f}"])
    return ["### Decode attention over left padding (`benchmarks/forward.py`)", "",
            "One forward of the 1.5B pack over a made-up KV cache (rows x cache columns x new tokens a row, a share of "
            "the slots left padding), decode attention batched over every row's whole width against per row (each "
            "row its own columns; taken only past the gate in agents/serving/cpu_attention.py, so below it both "
            "columns run the batched path).", "",
            *table(["results file", "machine", "shape", "padding", "forward ms batched (attention)",
                    "forward ms per-row gate (attention)", "speedup"], rows)]


def speed_attention(results: Path) -> list[str]:
    rows = []
    for name, d in speed_files(results, "attention"):
        with reading(name):
            sh = d["shape"]
            for r in d["rows"]:
                rows.append([name, _machine(d), f"{sh['rows']} x {sh['context']} x {sh['queries']}",
                             str(sh["kv_mb_read"]), r["kernels"], f"{r['ms_per_step']:.1f}", f"{r['kv_gb_per_s']:.1f}",
                             f"{r['max_abs_diff_vs_exact']:.1e}", f"{r['this_tree_faster']:.2f}"])
    return ["### Decode attention alone, kernel against kernel (`benchmarks/attention.py`)", "",
            "The compiled decode attention (agents/serving/kernels.c) of the tree that ran the benchmark against the "
            "same file at earlier commits, taking turns step after step over a made-up float16 KV cache of the 1.5B "
            "pack's shapes (28 layers, 12:2 heads, head size 128; rows x longest row's columns x query tokens a row, "
            "rows up to 199 columns apart). Largest difference from exact float32 attention over the same values.", "",
            *table(["results file", "machine", "shape", "K/V MB a step", "kernels", "ms a step", "K/V GB/s",
                    "max diff vs exact", "time over the tree's"], rows)]


def speed_int8_matmul(results: Path) -> list[str]:
    rows = []
    for name, d in speed_files(results, "int8_matmul"):
        with reading(name):
            for r in d["rows"]:
                rows.append([name, _machine(d), str(r["rows"]), f"{r['ms_per_step']:.1f}", f"{r['weight_gb_per_s']:.1f}",
                             str(r["g_mac_per_s"])])
    return ["### The int8 products alone, by rows (`benchmarks/int8_matmul.py`)", "",
            "torch._int_mm over the 1.5B pack's 28 layers of decoder matrices (1.31 GB of int8, every byte from "
            "memory), M rows at a time: at 1 row the products stream the weights at the memory's pace, with hundreds "
            "they near the CPU's int8 peak, and at decode's 16-64 rows they reach neither.", "",
            *table(["results file", "machine", "rows", "ms a step", "weights GB/s", "G multiply-adds/s"], rows)]


def speed_memory(results: Path) -> list[str]:
    rows, same_job = [], {}
    for name, d in speed_files(results, "memory"):
        with reading(name):
            for part, m in d["parts"].items():
                peak = m.get("time_v_max_rss_gib")
                tree = (m.get("tree_peak") or {}).get("tree")
                args = [a for a in d.get("job_args", []) if not a.startswith(("tracking.", "hydra.", "cache="))]
                args = job_as_today(args, d.get("utc", ""))
                short = any(a.startswith("dataset.limit=") for a in args)
                job = ("a short default job" if short else "the default job, every task") + (
                    f" (`{' '.join(args)}`)" if args else "")
                what = {"convert": "converting the pack", "load": "loading the model, one answer",
                        "job": job}.get(part, part)
                answers = m.get("answers") or {}
                passed = f"{sum(a['passed'] for a in answers.values())}/{len(answers)}" if answers else "-"
                if answers:
                    same_job.setdefault(" ".join(args), []).append((d.get("label", name), answers))
                rows.append([name, _machine(d), d.get("label", ""), what, f"{peak:.2f}" if peak is not None else "-",
                             f"{tree:.2f}" if tree is not None else "-", f"{m['seconds']:.0f}" if "seconds" in m else "-",
                             passed])
    return ["### Peak resident memory (`benchmarks/memory.py`)", "",
            "Each part in a child process of its own: `/usr/bin/time -v`'s maximum resident set of the process, and "
            "the whole process tree's peak (sandbox workers, Prefect's server) sampled with psutil. A short job is "
            "32 tasks in flight (`dataset.limit=32`), as many as the full job keeps.", "",
            *table(["results file", "machine", "label", "part", "peak RSS GiB (time -v)", "process tree GiB", "seconds",
                    "passed"], rows), *memory_reruns(same_job)]


# Defaults of the 1.5B pack that changed under the memory files: key -> ([(UTC stamp until which a value held, that
# value)], today's value), from the history of conf/model/qwen1.5b-coder-q4.yaml. A file's job is named by what differs
# from today's defaults, so that the table and the reruns below group the jobs that ran alike.
CHANGED_DEFAULTS = {"model.int8_skip": ([("20261127T003619Z", "[lm_head]")], "[]"),
                    "model.max_prefill_tokens": ([("20261126T192424Z", "8192"), ("20261127T025115Z", "2048")], "896"),
                    "model.int8_native": ([("20261127T180944Z", "false")], "true"),
                    "model.kv_dtype": ([("20261127T182831Z", "float32")], "auto")}


def job_as_today(args: list[str], utc: str) -> list[str]:
    for key, (history, today) in CHANGED_DEFAULTS.items():
        if any(a.split("=", 1)[0] == key for a in args):
            args = [a for a in args if a != f"{key}={today}"]
            continue
        then = next((v for until, v in history if utc < until), today)
        if then != today:
            args = [*args, f"{key}={then}"]
    return args


def memory_reruns(same_job: dict[str, list]) -> list[str]:
    """A sentence per job run more than once: how many tasks' code differs between the runs (protocol tests, greedy)."""
    out = []
    for args, runs in same_job.items():
        if len(runs) < 2:
            continue
        tasks = set.intersection(*(set(a) for _, a in runs))
        differ = sorted(t for t in tasks if len({a[t]["code_sha"] for _, a in runs}) > 1)
        (_, first), (_, last) = runs[0], runs[-1]
        b = sum(first[t]["passed"] and not last[t]["passed"] for t in tasks)
        c = sum(last[t]["passed"] and not first[t]["passed"] for t in tasks)
        out.append(f"- `{args}` ran {len(runs)} times ({', '.join(label for label, _ in runs)}): {len(differ)} of its "
                   f"{len(tasks)} tasks got different code in at least two runs; "
                   f"{' / '.join(str(sum(a[t]['passed'] for t in tasks)) for _, a in runs)} passed; first against last, "
                   f"{b} vs {c} tasks passed by one only (exact McNemar p = {sign_test_p(b, c):.2g}).")
    if out:
        out = ["Jobs run more than once, with changes between the runs that are meant to move memory or speed only "
               "(result-neutral settings, flows/neutral.py):", "", *out,
               "", "Greedy answers are not reproducible bit for bit on the 1.5B pack: which rows share a decode step "
               "depends on timing, and attention over the batch's padded width (and an fp32 lm_head, the default before "
               "`model.int8_skip=[]`) rounds a row differently in batches of different sizes (agents/serving/README). "
               "Compare runs by paired tests, not by equal code."]
    return ["", *out] if out else []


DECODE_PARTS = ("int8 matmuls", "of which torch._int_mm", "lm_head", "attention", "rest of the forward",
                "engine outside the forward")
PROFILE_FIXED = ("name", "pack", "weights", "dtype", "cpu_attention", "skinny_matmul")  # same in every profile
PREFILL_PARTS = ("int8 matmuls", "of which torch._int_mm", "attention", "rest of the forward")


def speed_sandbox(results: Path) -> list[str]:
    rows = []
    for name, d in speed_files(results, "sandbox"):
        with reading(name):
            base = d["a_fresh_interpreter"]["programs_per_s"]
            for key, way in SANDBOX_WAYS.items():
                if key not in d:
                    continue
                w = d[key]
                rows.append([name, _machine(d), way, str(d["programs"]), f"{w['programs_per_s']:.2f}",
                             f"{w['programs_per_s'] / base:.1f}x", "yes" if d["identical_verdicts"] else "no",
                             f"{w['canonical_passed']} / {w['buggy_not_passed']}", str(len(w["looping"])),
                             str(w["leftover_processes"])])
    return ["### Sandbox throughput (`benchmarks/sandbox.py`)", "",
            "Every canonical and every buggy HumanEvalFix program through each way of running them, in one run per "
            "file: the local bubblewrap jail (a new interpreter per program, warm forked workers) and, where the file "
            "has them, Docker (a container per program, warm containers).", "",
            *table(["results file", "machine", "way", "programs", "programs/s", "vs a new interpreter",
                    "identical verdicts", "canonical passed / buggy not passed", "ended at the timeout",
                    "processes left"], rows)]


def section_harness(results: Path) -> list[str]:
    rows = []
    for name in HARNESS:
        d = _read(results, name)
        with reading(name):
            for r in d["runs"]:
                p, o = r["params"], r["overall"]
                rows.append([f"`model={p['model.name']} sandbox={p.get('sandbox.backend', 'local')}`",
                             f"{o['passed']} / {o['total']}", str(int(r["cost"].get("errors", 0))),
                             minutes(r["cost"].get("wall_s")), r["run_id"][:8], link(name)])
    return ["## Harness checks", "", "The oracle doubles through the whole path on every task: the canonical solutions "
            "must all pass and the buggy ones all fail.", "",
            *table(["job", "passed", "errors", "wall", "run", "results file"], rows)]


FRONTIER_MODEL, FRONTIER_PROTOCOL = "qwen1.5b-coder-q4", "tests"  # the frontier the README shows
PICTURE = REPO / "docs" / "frontier.png"


def frontier_of(results: Path, protocol: str = FRONTIER_PROTOCOL):
    """The cost-accuracy frontier (flows/frontier.py) of the 1.5B pack under `protocol` over the fullsize files."""
    from .frontier import frontier, records_from_files

    return frontier(records_from_files(sorted(results.glob("fullsize-*.json"))), model=FRONTIER_MODEL,
                    protocol=protocol, paired_only=True)


def section_frontier(results: Path, protocol: str = FRONTIER_PROTOCOL) -> list[str]:
    """The frontier under `protocol`: under `tests` the answer the README gives, under `hidden` the same with the
    verdict of the full test the agent never saw (each run's overfit gap: section 2)."""
    from .frontier import markdown

    command = f"`python -m flows.frontier --model {FRONTIER_MODEL} --protocol {protocol} --paired-only`"
    if protocol == FRONTIER_PROTOCOL:
        head = ["## The answer: pass@1 against cost", "",
                f"Every configuration of {FRONTIER_MODEL} recorded on every task under protocol `{protocol}` with "
                "per-task outcomes, its cost per task, the Pareto set and a paired verdict for each step along it "
                f"({command}; picture: docs/frontier.png). A step buys something only where the paired test says so."]
    else:
        head = [f"## The frontier under `{protocol}`", "",
                f"The same, for {FRONTIER_MODEL} under protocol `{protocol}` ({command}). pass@1 is the verdict of "
                "the full test, which the agent never saw; each run's overfit gap is in section 2."]
    return head + ["", *markdown(frontier_of(results, protocol)).rstrip("\n").split("\n")]


def results_document(results: Path) -> str:
    sweeps = load_all(results)
    lines = ["# fixlab results", "",
             f"<!-- Generated by `{COMMAND}` from benchmarks/results/*.json. Edit flows/report.py (its registry says "
             "which file feeds which table), never this file. -->", "",
             "Every figure below is read from, or computed from, a results file in `benchmarks/results/` named in its "
             "row; MLflow run ids are their first 8 characters (the MLflow store is not kept in git). pass@1 is one "
             "sample per task after each round, with its 95% Wilson interval. Machines: "
             + "; ".join(f"{k} = {v}" for k, v in MACHINES.items()) + ", shared with other work.", "",
             "## Headline", "", *headline_block(sweeps, in_readme=False).split("\n"), ""]
    for section in (section_frontier(results), section_frontier(results, "hidden"), section_grid(sweeps), section_strategies(sweeps), section_protocols(sweeps), section_small(sweeps),
                    section_bug_types(sweeps), section_techniques(sweeps), section_tuning(sweeps),
                    section_harness(results), section_speed(sweeps, results)):
        lines += section + [""]
    return "\n".join(_wrap_prose(lines)).rstrip("\n") + "\n"


def _wrap_prose(lines: list[str]) -> list[str]:
    out = []
    for line in lines:
        if not line or line.startswith(("|", "#")):
            out.append(line)
        elif line.startswith("- "):
            out.append(textwrap.fill(line, WIDTH, subsequent_indent="  ", break_long_words=False,
                                     break_on_hyphens=False))
        else:
            out.append(wrap(line))
    return out


def speed_block(sweeps: dict[str, LoadedSweep], results: Path) -> str:
    """The README's speed paragraph, from the SPEED_HEADLINE files."""
    out = []
    with reading(SPEED_HEADLINE["job"]):
        d = _read(results, SPEED_HEADLINE["job"])
        job = d["parts"]["job"]
        answers = job.get("answers") or {}
        m = d["machine"]
        where = f"{m.get('cpus') or m.get('cores')}-core {m['cpu']}" + (
            f" ({m['cpu_family']})" if m.get("cpu_family") else " (AVX-512 VNNI)" if m.get("avx512_vnni") else "")
        peak = f"{job['time_v_max_rss_gib']:.2f} GiB"
        ready = job.get("model_ready_s")
        after = [x["rss"] for x in job.get("series_mib") or [] if ready and x["t"] >= ready]
        if after and max(after) / 1024 < job["time_v_max_rss_gib"] - 0.5:  # the peak came before the model was held
            peak += (f" while the model loaded and the machine's first use measured its path (the first "
                     f"{ready:.0f} s), {max(after) / 1024:.2f} GiB after that")
        out.append(f"On a {where}, `make eval`'s job (every task, 3 rounds) took {minutes(job['seconds'])} "
                   f"with a peak resident memory of {peak} "
                   f"({sum(a['passed'] for a in answers.values())}/{len(answers)} passed; {SPEED_HEADLINE['job']})"
                   + ".")
    with reading(SPEED_HEADLINE["decode"]):
        d = _read(results, SPEED_HEADLINE["decode"])
        now = [r for r in d["rows"] if not r.get("revision") and r.get("batch32_tok_s")]
        best = max(now, key=lambda r: r["batch32_tok_s"])
        def mean(rs: list[dict], k: str) -> float:  # a row repeated in the file: its mean
            return fmean(r[k] for r in rs)

        same = [r for r in now if r["weights"] == best["weights"]]
        then = [r for r in d["rows"] if r.get("revision") and r.get("batch32_tok_s")]
        out.append(f"The engine decodes {mean(same, 'batch32_tok_s'):.1f} tokens/s at 32 rows and {d['decode_context']} "
                   f"tokens of context, and prefills {mean(same, 'prefill_tok_s'):.0f} tokens/s"
                   + (f", against {mean(then, 'batch32_tok_s'):.1f} and {mean(then, 'prefill_tok_s'):.0f} for the "
                      f"engine of {then[0]['weights'].split('@')[1]} beside it, "
                      f"{mean(same, 'batch32_tok_s') / mean(then, 'batch32_tok_s'):.2f}x decode" if then else "")
                   + f" ({SPEED_HEADLINE['decode']}).")
    out += paths_sentences(results)
    out.append("More: docs/RESULTS.md, section 7.")
    return wrap("**Speed.** " + " ".join(out))


def paths_sentences(results: Path) -> list[str]:
    """What the path chooser takes on each CPU family measured (SPEED_HEADLINE's paths file), and the default row
    against llama.cpp on the same GGUF in each weights file SPEED_HEADLINE names for it."""
    out = []
    if "paths" in SPEED_HEADLINE:
        name = SPEED_HEADLINE["paths"]
        with reading(name):
            d = _read(results, name)
        modes = d["modes"]

        def at32(mode: str, prefix: str) -> float | None:  # the fastest servable path at 32 rows (not FBGEMM's)
            ms = [t.get("32") or t.get(32) for p, t in modes[mode]["matmul_ms"].items()
                  if p.startswith(prefix) and p != "int8:fbgemm"]
            ms = [x for x in ms if x]
            return min(ms) if ms else None

        words = [f"on {modes['native']['machine']['cpu']} ({modes['native']['machine']['cpu_family']}) `auto` takes "
                 f"{modes['native']['choice']['label']}"]
        if "avx2" in modes:
            a2, f32 = at32("avx2", "int8:"), at32("avx2", "float32")
            vnni = at32("vnni" if "vnni" in modes else "native", "int8:")
            words.append(f"held to AVX2 it takes {modes['avx2']['choice']['label']}, whose matmuls at 32 rows run "
                         f"{f32 / a2:.2f}x float32's and {vnni / a2:.2f}x the AVX-512 VNNI path's")
            fb = (modes["avx2"]["matmul_ms"].get("int8:fbgemm") or {})
            fb = fb.get("32") or fb.get(32)
            if fb:
                words.append(f"FBGEMM's dynamic int8 linear held to AVX2 runs them {a2 / fb:.2f}x fixlab's AVX2 kernel, "
                             "but rounds a whole batch's activations with one scale to 7 bits (a row's answer would "
                             "depend on its batch), so it is timed, not taken")
        out.append("The path is measured on each machine: " + "; ".join(words) + f" ({name}).")
    for key in ("default_vs_llamacpp", "default_vs_llamacpp_avx2"):
        if key not in SPEED_HEADLINE:
            continue
        name = SPEED_HEADLINE[key]
        with reading(name):
            d = _read(results, name)
        by = {r["weights"]: r for r in d["rows"]}
        if {"default", "llamacpp"} <= set(by) and by["llamacpp"].get("batch32_tok_s"):
            a, b = by["default"]["batch32_tok_s"], by["llamacpp"]["batch32_tok_s"]
            forced = (d["machine"].get("forced") or {}).get("FIXLAB_CPU_ISA")
            out.append(f"make eval's model as it resolves{' held to AVX2' if forced else ''} "
                       f"({by['default'].get('path', 'default')}) decodes {a:.1f} tokens/s at 32 rows and "
                       f"{d['decode_context']} tokens of context against {b:.1f} for llama.cpp on the same GGUF "
                       f"({a / b:.2f}x; {name}).")
    return out


def _with_block(text: str, start_mark: str, end_mark: str, block: str, what: str) -> str:
    start, end = text.find(start_mark), text.find(end_mark)
    if start < 0 or end < start:
        raise ReportError(f"README.md has no {start_mark} ... {end_mark} block for the {what}: add the two marker "
                          "lines where it belongs")
    return text[:start] + start_mark + "\n" + block + "\n" + text[end:]


def readme_with_headline(readme_text: str, results: Path) -> str:
    """The README with its generated blocks (the headline, the speed paragraph) rewritten from the files."""
    from .frontier import verdict_words

    sweeps = load_all(results)
    text = _with_block(readme_text, HEADLINE_START, HEADLINE_END,
                       headline_block(sweeps, frontier_words=verdict_words(frontier_of(results))), "headline")
    return _with_block(text, SPEED_START, SPEED_END, speed_block(sweeps, results), "speed paragraph")


# ---------------------------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=COMMAND, description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if a document differs from the files")
    ap.add_argument("--results", type=Path, default=RESULTS_DIR, help="results folder (default benchmarks/results)")
    ap.add_argument("--doc", type=Path, default=DOC, help="results document (default docs/RESULTS.md)")
    ap.add_argument("--readme", type=Path, default=README, help="README with the headline block (default README.md)")
    args = ap.parse_args(argv)
    try:
        missing = unlisted(args.results)
        if missing:
            raise ReportError(f"{', '.join(missing)} in {args.results} feed no table: add an entry for each to the "
                              "registry in flows/report.py")
        doc = results_document(args.results)
        readme = readme_with_headline(args.readme.read_text(), args.results)
        picture = png_bytes(frontier_of(args.results))
    except (ReportError, FrontierError) as e:
        print(f"flows.report: {e}", file=sys.stderr)
        return 2
    outputs = ((args.doc, doc), (args.readme, readme), (args.doc.parent / PICTURE.name, picture))
    stale = [p for p, content in outputs
             if not p.exists() or (p.read_bytes() if isinstance(content, bytes) else p.read_text()) != content]
    if args.check:
        if stale:
            print(f"flows.report: {' and '.join(str(p) for p in stale)} differ from what {args.results} says: "
                  f"run `{COMMAND}` and commit the result", file=sys.stderr)
            return 1
        print(f"flows.report: {args.doc} and {args.readme}'s headline match {args.results}")
        return 0
    for p, content in outputs:
        if p in stale:
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(content) if isinstance(content, bytes) else p.write_text(content)
            print(f"flows.report: wrote {p}")
    if not stale:
        print("flows.report: nothing to change")
    return 0


if __name__ == "__main__":
    sys.exit(main())
