"""C++ programs in the jail: the reference's scoring on canonical and buggy solutions, a verdict that the reward
hacks a model writes in C++ cannot fake (each of them passes the reference harness's own exit-code verdict), and the
sandbox's promises (no network, no writes outside scratch, no process left)."""
from __future__ import annotations

import pytest

from lang_fixtures import by_id, rows, run, sandbox, solution, task  # noqa: F401 (sandbox is a fixture)
from sandboxes.languages import language

LANG = language("cpp")
# A sample of tasks that exercise the layout: helpers in the declaration (10, 32, 38, 50), a declaration that holds
# part of the body (38), boost (22, 137), OpenSSL's md5 (162), and a few plain ones.
SAMPLE = (0, 10, 22, 32, 38, 50, 53, 100, 137, 162)
# CPP/23's test calls strlen("") and strlen("x"): with <cstring> in the include helper, the C library's
# strlen(const char*) is the better overload, so the tests never reach the candidate and the buggy body passes, in
# the reference's one-file layout as in fixlab's (the reference harness passes it too).
BUGGY_PASSES = {23: "the tests call the C library's strlen, not the candidate's"}

OK_BODY = """bool has_close_elements(vector<float> numbers, float threshold){
    for (int i=0;i<numbers.size();i++) for (int j=i+1;j<numbers.size();j++)
        if (abs(numbers[i]-numbers[j])<threshold) return true;
    return false;
}
"""
WRONG = "bool has_close_elements(vector<float> numbers, float threshold){ return false; }\n"
HACKS = {
    "early exit": "bool has_close_elements(vector<float> numbers, float threshold){ exit(0); }\n",
    "early _exit": "#include<unistd.h>\nbool has_close_elements(vector<float> n, float t){ _exit(0); }\n",
    "static initialiser exits": "static int fixlab_x = (exit(0), 0);\n" + WRONG,
    "constructor attribute exits": "#include<unistd.h>\n__attribute__((constructor)) static void go(){ _exit(0); }\n" + WRONG,
    "tests renamed away by a macro": WRONG + "auto main() -> int { return 0; }\n#define main fixlab_never\n",
    "assertion function replaced": WRONG + 'extern "C" void __assert_fail(const char*, const char*, unsigned int, '
                                           'const char*) throw() {}\n',
    "abort swallowed by a signal handler": "#include<csignal>\n#include<unistd.h>\n"
                                           "static void quiet(int){ _exit(0); }\n"
                                           "static int fixlab_h = (signal(SIGABRT, quiet), 0);\n" + WRONG,
    "output muted": "static int fixlab_m = (fclose(stderr), fclose(stdout), 0);\n" + WRONG,
}


@pytest.mark.parametrize("n", SAMPLE)
def test_canonical_solutions_pass(sandbox, n):
    row = by_id("cpp", n)
    res = run(sandbox, LANG, solution(LANG, row), row)
    assert res.status == "passed", (res.stderr[-500:], res.details)
    assert res.details["compile_s"] > 0 and res.details["run_s"] >= 0  # compiling and running timed apart


@pytest.mark.parametrize("n", tuple(n for n in SAMPLE if n != 137) + tuple(BUGGY_PASSES))  # 137's loops 60 s
def test_buggy_solutions_fail_as_the_reference_says(sandbox, n):
    row = by_id("cpp", n)
    res = run(sandbox, LANG, solution(LANG, row, "buggy"), row)
    if n in BUGGY_PASSES:
        assert res.status == "passed", res.details
    else:  # a failed assertion, or a loop stopped at the time limit
        assert res.status in ("failed", "timeout"), res.details


@pytest.mark.parametrize("name", sorted(HACKS))
def test_a_hack_passes_the_reference_and_fails_here(sandbox, name):
    row = by_id("cpp", 0)
    code = HACKS[name]
    ref = sandbox.run(LANG.reference_as_program(code, row["test"], task(row)), 10)
    if name != "output muted":  # muting hides the assertion's message; the reference still sees the abort
        assert ref.exit_code == 0 and LANG.reference_pass(ref.exit_code, ref.stdout, ref.stderr), \
            f"{name}: the reference's own verdict should be fooled ({ref.exit_code}, {ref.stderr[-300:]})"
    res = run(sandbox, LANG, code, row)
    assert res.status == "failed", (name, res.status, res.stderr[-300:])


def test_a_compile_error_is_a_failure_with_the_compilers_message(sandbox):
    row = by_id("cpp", 0)
    res = run(sandbox, LANG, "bool has_close_elements(vector<float> n, float t){ return nope; }\n", row)
    assert res.status == "failed" and res.details["stage"] == "compile" and res.error_type == "CompileError"
    assert "nope" in res.stderr and "was not declared" in res.stderr


def test_an_assertion_names_its_line(sandbox):
    row = by_id("cpp", 0)
    res = run(sandbox, LANG, WRONG, row)
    assert res.status == "failed" and res.error_type == "AssertionError"
    assert res.failing_line == "has_close_elements(a, 0.3)==true"


def test_the_correct_fix_passes_and_the_verdicts_hold_for_it(sandbox):
    row = by_id("cpp", 0)
    assert run(sandbox, LANG, OK_BODY, row).status == "passed"


PROBE = """#include<sys/socket.h>
#include<netinet/in.h>
#include<arpa/inet.h>
#include<errno.h>
static int fixlab_probe = [](){
    int s = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{}; a.sin_family = AF_INET; a.sin_port = htons(80); inet_pton(AF_INET, "1.1.1.1", &a.sin_addr);
    int c = s < 0 ? -1 : connect(s, (sockaddr*)&a, sizeof a);
    FILE* f = fopen("%s", "w");
    printf("connect=%%d write=%%d\\n", c, f != NULL);
    return 0;
}();
"""


def test_no_network_and_no_write_outside_scratch(sandbox, tmp_path):
    row = by_id("cpp", 0)
    target = tmp_path / "escaped"
    res = run(sandbox, LANG, PROBE % target + OK_BODY, row)
    assert "connect=-1 write=0" in res.stdout, (res.stdout, res.stderr[-300:])
    assert not target.exists()


def test_a_fork_is_refused_before_the_program_runs(sandbox):
    row = by_id("cpp", 0)
    res = run(sandbox, LANG, "#include<unistd.h>\nstatic int fixlab_f = fork();\n" + OK_BODY, row)
    assert res.status == "failed" and res.error_type == "PolicyError" and "fork" in res.stderr


def test_a_program_that_never_ends_is_stopped_and_leaves_nothing(sandbox):
    from sandboxes.procs import processes_of_uids

    row = by_id("cpp", 0)
    prog = LANG.program("bool has_close_elements(vector<float> n, float t){ for(;;); }\n", row["test"], task(row),
                        run_timeout_s=0.5)
    short = type(prog)(prog.language, prog.files, prog.steps[:-1] + (
        type(prog.steps[-1])(**{**prog.steps[-1].__dict__, "timeout_s": 1.0}),), prog.shown_file)
    res = sandbox.run(short, 10)
    assert res.status == "timeout"
    uids = range(sandbox.uid_base, sandbox.uid_base + sandbox.workers)
    assert processes_of_uids(uids) == []
