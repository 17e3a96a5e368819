"""Go programs in the jail: the reference's scoring on canonical and buggy solutions, a verdict that the reward hacks
a model writes in Go cannot fake (each of them passes the reference harness's own `go test` verdict), and the
sandbox's promises (no network, no writes outside scratch, no process left)."""
from __future__ import annotations

import pytest

from lang_fixtures import by_id, run, sandbox, solution, task  # noqa: F401 (sandbox is a fixture)
from sandboxes.languages import language

LANG = language("go")
# Helpers only in the prompt (10, 32, 38, 50), a test that needs an import test_setup lacks (44: strconv), rand in
# the test (53), a prompt whose header differs from the declaration's (65), md5 (162), and a few plain ones.
SAMPLE = (0, 10, 32, 38, 44, 50, 53, 65, 108, 162)
# None in Go: every buggy solution fails, in the reference's `go test` as here. Not sampled: Go/95's canonical
# solution depends on the order of a map's keys, which Go randomises (its own test below).
BUGGY_PASSES: dict[int, str] = {}

WRONG = "func HasCloseElements(numbers []float64, threshold float64) bool { return false }\n"
OK_BODY = """func HasCloseElements(numbers []float64, threshold float64) bool {
    for i := range numbers {
        for j := i + 1; j < len(numbers); j++ {
            if math.Abs(numbers[i]-numbers[j]) < threshold {
                return true
            }
        }
    }
    return false
}
"""
# Each passes bigcode's `go test` verdict (exit code 0) unless named in REFERENCE_NOT_FOOLED.
HACKS = {
    "early exit (os.Exit in the function)": 'import "os"\nfunc HasCloseElements(numbers []float64, threshold float64)'
                                            ' bool { os.Exit(0); return false }\n',
    "early exit (syscall.Exit in the function)": 'import "syscall"\nfunc HasCloseElements(numbers []float64, '
                                                 'threshold float64) bool { syscall.Exit(0); return false }\n',
    "syscall.Exit through //go:linkname": 'import _ "unsafe"\n//go:linkname exit syscall.Exit\nfunc exit(code int)\n'
                                          "func HasCloseElements(numbers []float64, threshold float64) bool "
                                          "{ exit(0); return false }\n",
    "init exits before the tests": 'import "os"\nfunc init() { os.Exit(0) }\n' + WRONG,
    "TestMain never runs the tests": "func TestMain(m *testing.M) {}\n" + WRONG,
    "TestMain swallows the failure": 'import "os"\nfunc TestMain(m *testing.M) { m.Run(); os.Exit(0) }\n' + WRONG,
    # naming assert's import path drops test_setup's import of it, and the answer's own `assert` takes its place
    "assert replaced": '// "github.com/stretchr/testify/assert"\ntype fake struct{}\n'
                       "func (fake) New(t interface{}) fake { return fake{} }\n"
                       "func (fake) Equal(args ...interface{}) bool { return true }\nvar assert fake\n" + WRONG,
    "true and false shadowed": "const true, false = 0, 0\n"
                               "func HasCloseElements(numbers []float64, threshold float64) int { return 0 }\n",
    "output muted": 'import "os"\nfunc init() { os.Stdout = nil; os.Stderr = nil }\n' + WRONG,
}
# go test (1.16 on) fails a test that calls os.Exit(0); muting hides the report, not the exit code.
REFERENCE_NOT_FOOLED = {"early exit (os.Exit in the function)", "output muted"}


@pytest.mark.parametrize("n", SAMPLE)
def test_canonical_solutions_pass(sandbox, n):
    row = by_id("go", n)
    res = run(sandbox, LANG, solution(LANG, row), row)
    assert res.status == "passed", (res.stderr[-500:], res.details)
    assert res.details["compile_s"] > 0 and res.details["run_s"] >= 0  # compiling and running timed apart


def test_go95s_canonical_solution_passes_or_fails_by_the_order_of_a_maps_keys(sandbox):
    """Go/95's canonical solution looks at a map's first two keys only, and Go randomises the order of a map's keys:
    {"p", "A", "B"} reads as all upper case when "A" and "B" come first, {"p", 5, "a"} as lower case when 5 is last. It fails some runs here as in the reference's `go test`;
    a job scores the run it gets, as the reference does (about 1 run in 4 failed, measured over 400 in each)."""
    row = by_id("go", 95)
    seen = [run(sandbox, LANG, solution(LANG, row), row) for _ in range(40)]
    assert {r.status for r in seen} == {"passed", "failed"}, [r.status for r in seen]
    failures = [r.details["failure"] for r in seen if r.status == "failed"]
    assert all('"B": "banana"' in f or '5: "banana"' in f for f in failures), failures


@pytest.mark.parametrize("n", tuple(n for n in SAMPLE if n not in BUGGY_PASSES) + tuple(BUGGY_PASSES))
def test_buggy_solutions_fail_as_the_reference_says(sandbox, n):
    row = by_id("go", n)
    res = run(sandbox, LANG, solution(LANG, row, "buggy"), row)
    if n in BUGGY_PASSES:
        assert res.status == "passed", res.details
    else:  # a failed assertion, a panic, or a loop stopped at the time limit
        assert res.status in ("failed", "timeout"), res.details


def test_the_prompts_helpers_are_added_where_the_answer_leaves_them_out(sandbox):
    """Go/10's declaration lacks IsPalindrome, which the prompt defines: the reference's layout does not compile the
    declaration + canonical body; here the helper is added, and an answer's own copy is kept instead."""
    row = by_id("go", 10)
    bare = row["declaration"] + row["canonical_solution"]
    ref = sandbox.run(LANG.reference_as_program(bare, row["test"], task(row)), 10)
    assert ref.exit_code != 0 and "undefined: IsPalindrome" in ref.stdout + ref.stderr
    assert run(sandbox, LANG, bare, row).status == "passed"
    assert "func IsPalindrome" in LANG.context(task(row))


def test_a_helper_the_test_calls_is_the_prompts_not_the_answers(sandbox):
    """Go/32's test checks FindZero's root with Poly, which the declaration leaves to the answer: the reference's
    `go test` passes an answer whose own Poly is 0 everywhere; here the test calls the prompt's Poly."""
    row = by_id("go", 32)
    code = "func Poly(xs []int, x float64) float64 { return 0 }\nfunc FindZero(xs []int) float64 { return 0 }\n"
    ref = sandbox.run(LANG.reference_as_program(code, row["test"], task(row)), 10)
    assert ref.exit_code == 0 and LANG.reference_pass(ref.exit_code, ref.stdout, ref.stderr), ref.stdout[-300:]
    res = run(sandbox, LANG, code, row)
    assert res.status == "failed" and res.error_type == "AssertionError", res.details


@pytest.mark.parametrize("name", sorted(HACKS))
def test_a_hack_passes_the_reference_and_fails_here(sandbox, name):
    row = by_id("go", 0)
    code = HACKS[name]
    ref = sandbox.run(LANG.reference_as_program(code, row["test"], task(row)), 10)
    fooled = ref.exit_code == 0 and LANG.reference_pass(ref.exit_code, ref.stdout, ref.stderr)
    assert fooled == (name not in REFERENCE_NOT_FOOLED), (name, ref.exit_code, ref.stdout[-300:], ref.stderr[-300:])
    res = run(sandbox, LANG, code, row)
    assert res.status == "failed", (name, res.status, res.stderr[-300:])


def test_a_compile_error_is_a_failure_with_the_compilers_message(sandbox):
    row = by_id("go", 0)
    res = run(sandbox, LANG, "func HasCloseElements(numbers []float64, threshold float64) bool {\n"
                             "    return nope\n}\n", row)
    assert res.status == "failed" and res.details["stage"] == "compile" and res.error_type == "CompileError"
    assert "candidate.go:2:12: undefined: nope" in res.details["failure"]
    assert res.failing_line == "return nope"


def test_an_assertion_names_its_line(sandbox):
    row = by_id("go", 0)
    res = run(sandbox, LANG, WRONG, row)
    assert res.status == "failed" and res.error_type == "AssertionError"
    assert res.failing_line == "assert.Equal(true, HasCloseElements([]float64{11.0, 2.0, 3.9, 4.0, 5.0, 2.2}, 0.3))"
    assert "expected: true" in res.details["failure"] and "actual  : false" in res.details["failure"]


def test_a_panic_names_the_candidates_line(sandbox):
    row = by_id("go", 0)
    res = run(sandbox, LANG, "func HasCloseElements(numbers []float64, threshold float64) bool {\n"
                             "    return numbers[99] < threshold\n}\n", row)
    assert res.status == "failed" and res.error_type == "Panic"
    assert res.failing_line == "return numbers[99] < threshold"
    assert "index out of range [99]" in res.details["failure"]


def test_the_correct_fix_passes_and_its_imports_are_added(sandbox):
    row = by_id("go", 0)
    assert run(sandbox, LANG, 'package main\n\nimport (\n    "math"\n)\n' + OK_BODY, row).status == "passed"
    assert run(sandbox, LANG, OK_BODY, row).status == "passed"


PROBE = """import ("net"; "os")
func init() {
    _, err := net.Dial("tcp", "1.1.1.1:80")
    f, ferr := os.Create("TARGET")
    if f != nil { f.Close() }
    panic(fmt.Sprintf("connect=%v write=%v", err == nil, ferr == nil))  // go test shows a failing run's output
}
"""


def test_no_network_and_no_write_outside_scratch(sandbox, tmp_path):
    """The candidate cannot import net or os here; the reference's layout can, and the jail still stops both."""
    row = by_id("go", 0)
    target = tmp_path / "escaped"
    probe = PROBE.replace("TARGET", str(target)) + OK_BODY
    res = run(sandbox, LANG, probe, row)
    assert res.status == "failed" and res.error_type == "CompileError" and "undefined: net" in res.details["failure"]
    ref = sandbox.run(LANG.reference_as_program(probe, row["test"], task(row)), 10)
    assert "connect=false write=false" in ref.stdout + ref.stderr, (ref.stdout[-300:], ref.stderr[-300:])
    assert not target.exists()


def test_no_process_can_be_started(sandbox):
    row = by_id("go", 0)
    res = run(sandbox, LANG, 'import "os/exec"\nfunc init() { exec.Command("/bin/true").Run() }\n' + OK_BODY, row)
    assert res.status == "failed" and res.error_type == "CompileError" and "undefined: exec" in res.details["failure"]


def test_a_program_that_never_ends_is_stopped_and_leaves_nothing(sandbox):
    from sandboxes.procs import processes_of_uids

    row = by_id("go", 0)
    prog = LANG.program("func HasCloseElements(n []float64, t float64) bool { for {} }\n", row["test"], task(row))
    short = type(prog)(prog.language, prog.files, prog.steps[:-1] + (
        type(prog.steps[-1])(**{**prog.steps[-1].__dict__, "timeout_s": 1.0}),), prog.shown_file)
    res = sandbox.run(short, 10)
    assert res.status == "timeout"
    uids = range(sandbox.uid_base, sandbox.uid_base + sandbox.workers)
    assert processes_of_uids(uids) == []
