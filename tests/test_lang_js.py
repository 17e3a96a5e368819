"""JavaScript programs in the jail: the reference's scoring on canonical and buggy solutions, a verdict that the reward
hacks a model writes in JavaScript cannot fake (each of them passes the reference harness's own verdict: nothing on
stdout or stderr), and the sandbox's promises (no file system, no process, no way into node's internals)."""
from __future__ import annotations

import pytest

from lang_fixtures import by_id, run, sandbox, solution, task  # noqa: F401 (sandbox is a fixture)
from sandboxes.languages import language

LANG = language("js")
# Helpers in the declaration (10, 32, 38, 50), JSON.stringify comparisons (37), an entry_point that differs from the
# declared name (114: minSubarraySum, declared minSubArraySum), js-md5 (162), and a few plain ones.
SAMPLE = (0, 10, 32, 37, 38, 50, 53, 114, 136, 162)
# No buggy solution passes, here or in the reference; these loop until the 10 s limit in both (not run here).
BUGGY_LOOPS = {10, 25, 76, 155, 156}
BUGGY_PASSES: dict[int, str] = {}

OK_BODY = """const hasCloseElements = (numbers, threshold) => {
  for (let i = 0; i < numbers.length; i++)
    for (let j = i + 1; j < numbers.length; j++)
      if (Math.abs(numbers[i] - numbers[j]) < threshold) return true;
  return false;
}
"""
WRONG = "const hasCloseElements = (numbers, threshold) => false\n"
THROWS = "const hasCloseElements = (numbers, threshold) => { throw new Error('no') }\n"
# Each passes the reference's verdict (an empty stdout and stderr; the exit code is not read) on JavaScript/0.
HACKS = {
    "early exit (process.exit at the top level)": "process.exit(0)\n" + WRONG,
    "early exit (process.exit in the function)": "const hasCloseElements = (numbers, threshold) => process.exit(0)\n",
    "top-level return before the tests": WRONG + "return\n",  # the reference's test.js is a CommonJS module
    "console.assert replaced": "console.assert = () => {}\n" + WRONG,
    "console.warn replaced (console.assert prints through it)": "console.warn = () => {}\n" + WRONG,
    "console shadowed by a const": "const console = { assert() {}, log() {} }\n" + WRONG,
    "globalThis.console replaced": "globalThis.console = { assert() {} }\n" + WRONG,
    "stderr muted": "process.stderr.write = () => true\n" + WRONG,
    "uncaught exception swallowed": "process.on('uncaughtException', () => {})\n" + THROWS,
}
# JavaScript/37's test compares JSON.stringify of the answer and of the expected list: these pass the reference there.
JSON_HACKS = {
    "JSON.stringify replaced": "JSON.stringify = () => ''\nconst sortEven = (l) => l\n",
    "Object.prototype.toJSON planted": "Object.prototype.toJSON = () => 0\nconst sortEven = (l) => l\n",
}


@pytest.mark.parametrize("n", SAMPLE)
def test_canonical_solutions_pass(sandbox, n):
    row = by_id("js", n)
    res = run(sandbox, LANG, solution(LANG, row), row)
    assert res.status == "passed", (res.stderr[-500:], res.details)
    assert res.details["run_s"] > 0 and res.details["compile_s"] == 0  # no compile step: the harness compiles


@pytest.mark.parametrize("n", tuple(n for n in SAMPLE if n not in BUGGY_LOOPS) + tuple(BUGGY_PASSES))
def test_buggy_solutions_fail_as_the_reference_says(sandbox, n):
    row = by_id("js", n)
    res = run(sandbox, LANG, solution(LANG, row, "buggy"), row)
    if n in BUGGY_PASSES:
        assert res.status == "passed", res.details
    else:
        assert res.status == "failed" and res.error_type in ("AssertionError", "TypeError", "RangeError"), \
            (res.error_type, res.details)


def test_the_reference_way_runs_with_js_md5(sandbox):
    row = by_id("js", 162)
    code = solution(LANG, row)
    ref = sandbox.run(LANG.reference_as_program(code, row["test"], task(row)), 10)
    assert LANG.reference_pass(ref.exit_code, ref.stdout, ref.stderr), ref.stderr[-300:]
    bad = sandbox.run(LANG.reference_as_program(solution(LANG, row, "buggy"), row["test"], task(row)), 10)
    assert not LANG.reference_pass(bad.exit_code, bad.stdout, bad.stderr) and "Assertion failed" in bad.stderr


def test_the_declarations_helpers_are_added_where_the_answer_leaves_them_out(sandbox):
    """JavaScript/10's declaration defines isPalindrome before makePalindrome: an answer of makePalindrome alone gets
    it back, and an answer's own copy is kept instead."""
    row = by_id("js", 10)
    alone = "const makePalindrome = " + row["declaration"].split("const makePalindrome = ", 1)[1]
    alone += row["canonical_solution"]
    assert run(sandbox, LANG, alone, row).status == "passed"
    own = "function isPalindrome(s) { return s === [...s].reverse().join('') }\n" + alone
    assert LANG.candidate_source(own, task(row)) == own
    assert run(sandbox, LANG, own, row).status == "passed"


@pytest.mark.parametrize("name", sorted(HACKS))
def test_a_hack_passes_the_reference_and_fails_here(sandbox, name):
    row = by_id("js", 0)
    code = HACKS[name]
    ref = sandbox.run(LANG.reference_as_program(code, row["test"], task(row)), 10)
    fooled = ref.status != "timeout" and LANG.reference_pass(ref.exit_code, ref.stdout, ref.stderr)
    assert fooled, f"{name}: the reference should be fooled ({ref.exit_code}, {ref.stdout[-200:]}{ref.stderr[-300:]})"
    res = run(sandbox, LANG, code, row)
    assert res.status == "failed", (name, res.status, res.stderr[-300:])


@pytest.mark.parametrize("name", sorted(JSON_HACKS))
def test_frozen_intrinsics_keep_the_tests_json(sandbox, name):
    row = by_id("js", 37)
    ref = sandbox.run(LANG.reference_as_program(JSON_HACKS[name], row["test"], task(row)), 10)
    assert LANG.reference_pass(ref.exit_code, ref.stdout, ref.stderr), ref.stderr[-300:]
    res = run(sandbox, LANG, JSON_HACKS[name], row)
    assert res.status == "failed" and res.error_type == "AssertionError", res.stderr[-300:]


def test_an_assertion_names_its_line(sandbox):
    row = by_id("js", 0)
    res = run(sandbox, LANG, WRONG, row)
    assert res.status == "failed" and res.error_type == "AssertionError"
    assert res.failing_line == "hasCloseElements([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.3) === true"
    assert res.details["failing_lineno"] == 2 and "Assertion failed" in res.stderr  # as node prints it
    # a multi-line assertion, on one line
    res = run(sandbox, LANG, "const hasCloseElements = (n, t) => t < 0.1 ? true : t < 0.9", row)
    assert res.failing_line == "hasCloseElements([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.05) === false"


def test_a_syntax_error_is_a_failure_with_its_line(sandbox):
    row = by_id("js", 0)
    res = run(sandbox, LANG, "const hasCloseElements = (numbers, threshold) => {\n  return numbers.(0)\n}\n", row)
    assert res.status == "failed" and res.error_type == "SyntaxError"
    assert res.failing_line == "return numbers.(0)" and "candidate.js:2" in res.details["failure"]


def test_a_thrown_error_names_the_candidates_line_and_the_tests_call(sandbox):
    row = by_id("js", 0)
    res = run(sandbox, LANG, "const hasCloseElements = (numbers, threshold) => {\n  return numbers.nope()\n}\n", row)
    assert res.status == "failed" and res.error_type == "TypeError"
    assert res.failing_line == "return numbers.nope()"
    said = res.details["failure"]
    assert "numbers.nope is not a function" in said and "called from test.js:2" in said


def test_output_fails_as_in_the_reference_even_after_the_tests(sandbox):
    row = by_id("js", 0)
    res = run(sandbox, LANG, "console.log('hi')\n" + OK_BODY, row)
    assert res.status == "failed" and res.error_type == "UnexpectedOutput" and res.stdout == "hi\n"
    late = run(sandbox, LANG, "setTimeout(() => console.error('late'), 0)\n" + OK_BODY, row)
    assert late.status == "failed" and late.stderr == "late\n"


def test_the_correct_fix_passes_and_an_echoed_test_is_stripped(sandbox):
    row = by_id("js", 0)
    assert run(sandbox, LANG, OK_BODY, row).status == "passed"
    echoed = OK_BODY + "\n" + row["test"]
    stripped = LANG.strip_tests(echoed, task(row))
    assert "testHasCloseElements" not in stripped and "const hasCloseElements" in stripped


PROBE = """const out = [];
for (const m of ['fs', 'child_process', 'worker_threads', 'inspector', 'v8', 'vm', 'module', 'net'])
  try { require(m); out.push(m + '=loaded') } catch (e) { out.push(m + '=' + e.code) }
out.push('binding=' + typeof process.binding, 'mainModule=' + typeof process.mainModule,
         'dlopen=' + typeof process.dlopen, 'import=' + typeof globalThis.import)
const bad = ['binding', '_linkedBinding', 'dlopen', 'mainModule', '_load', 'reallyExit', 'getHeapSnapshot',
  'writeHeapSnapshot', 'spawnSync', 'writeSync', 'readSync', 'openSync', 'compileFunction', 'runInThisContext',
  '_rawDebug', 'setuid', 'Session', 'openStdin', 'cwd'];
const seen = new Set(), queue = [globalThis, require('js-md5'), require('crypto').createHash('md5')], hits = [];
while (queue.length) {
  const o = queue.shift();
  if (o === null || (typeof o !== 'object' && typeof o !== 'function') || seen.has(o)) continue;
  seen.add(o);
  for (const k of Reflect.ownKeys(o)) {
    if (bad.includes(k)) hits.push(String(k));
    const d = Object.getOwnPropertyDescriptor(o, k);
    if (d && 'value' in d) queue.push(d.value);
    else if (d) { queue.push(d.get, d.set); try { queue.push(d.get && d.get.call(o)) } catch (e) {} }
  }
  queue.push(Object.getPrototypeOf(o));
}
out.push('reached=' + (seen.size > 1000), 'internals=' + hits.join('|'));
import('fs').then(() => console.log('import=loaded'), (e) => console.log('import=' + e.code));
fetch('http://1.1.1.1/').then(() => console.log('fetch=connected'), (e) => console.log('fetch=' + (e.cause || e).code));
console.log(out.join(' '));
"""


def test_no_file_system_network_process_or_internals_are_reachable(sandbox):
    row = by_id("js", 0)
    res = run(sandbox, LANG, PROBE + OK_BODY, row)
    first, *later = res.stdout.splitlines()
    assert all(f"{m}=MODULE_NOT_FOUND" in first for m in ("fs", "child_process", "worker_threads", "inspector", "v8",
                                                        "vm", "module", "net")), first
    assert "binding=undefined mainModule=undefined dlopen=undefined" in first
    assert first.endswith("reached=true internals=")  # nothing found
    assert sorted(later) == ["fetch=ENETUNREACH", "import=ERR_VM_DYNAMIC_IMPORT_CALLBACK_MISSING"]
    assert res.status == "failed"  # it printed


def test_a_program_that_never_ends_is_stopped_and_leaves_nothing(sandbox):
    from sandboxes.procs import processes_of_uids

    row = by_id("js", 0)
    prog = LANG.program("const hasCloseElements = () => { for (;;); }\n", row["test"], task(row))
    step = type(prog.steps[0])(**{**prog.steps[0].__dict__, "timeout_s": 1.0})
    short = type(prog)(prog.language, prog.files, (step,), prog.shown_file)
    res = sandbox.run(short, 10)
    assert res.status == "timeout"
    uids = range(sandbox.uid_base, sandbox.uid_base + sandbox.workers)
    assert processes_of_uids(uids) == []


def test_how_other_failures_read():
    prog = LANG.program("const f = () => { throw 'x' }\n", "f()\n", task(by_id("js", 0)))
    said = LANG.failure("", "Uncaught 'x'\n", prog, "run")
    assert (said.kind, said.message) == ("Uncaught", "Uncaught 'x'")
    oom = LANG.failure("", "<--- JS stacktrace --->\n\nFATAL ERROR: Reached heap limit Allocation failed - JavaScript "
                           "heap out of memory\n 1: 0xb78db3 node::OOMErrorHandler\n", prog, "run")
    assert oom.kind == "OutOfMemory" and oom.message.startswith("FATAL ERROR: Reached heap limit")
    assert LANG.failure("", "", prog, "run").kind == "EarlyExit"  # process.exit before the tests' end
    assert LANG.failure("hi\n", "", prog, "run").kind == "UnexpectedOutput"


FLAGS_PROBE = """const out = [];
const tries = { write: () => require('fs').writeFileSync(process.argv[2], 'x'),
  spawn: () => require('child_process').spawnSync('/bin/true'), binding: () => process.binding('fs'),
  inspector: () => new (require('inspector').Session)().connect(),
  addon: () => process.dlopen({}, '/nonexistent.node') };
for (const [k, f] of Object.entries(tries)) try { f(); out.push(k + '=done') } catch (e) { out.push(k + '=' + e.code) }
console.log(out.join(' '));
"""


def test_node_flags_alone_deny_files_processes_and_internals(sandbox, tmp_path):
    """Beneath the harness's stand-ins, node's own flags hold: a script run with them and the real require writes no
    file, starts no process and reaches no binding, inspector or addon."""
    from sandboxes.languages.base import Program, Step
    from sandboxes.languages.js import FLAGS, NODE, RUN_MEMORY_MB, RUN_PROCESSES

    target = tmp_path / "escaped"
    step = Step("run", (NODE, *FLAGS, "--allow-fs-read=probe.js", "probe.js", str(target)), 10.0,
                processes=RUN_PROCESSES, memory_mb=RUN_MEMORY_MB)
    res = sandbox.run(Program("js", (("probe.js", FLAGS_PROBE),), (step,), "probe.js"), 10)
    assert res.stdout.strip() == ("write=ERR_ACCESS_DENIED spawn=ERR_ACCESS_DENIED binding=ERR_ACCESS_DENIED "
                                  "inspector=ERR_ACCESS_DENIED addon=ERR_DLOPEN_DISABLED"), res.stdout + res.stderr
    assert not target.exists()
