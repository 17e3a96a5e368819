"""Rust programs in the jail: the reference's scoring on canonical and buggy solutions, a verdict that the reward hacks
a model writes in Rust cannot fake (each of them passes the reference harness's own exit-code verdict: `cargo test`
in its cargo project), and the sandbox's promises (no network, no writes outside scratch, no process left)."""
from __future__ import annotations

import pytest

from lang_fixtures import by_id, run, sandbox, solution, task  # noqa: F401 (sandbox is a fixture)
from sandboxes.languages import language

LANG = language("rust")
# Tasks that exercise the layout: helpers in the declaration that the tests call (38, 50), a helper the entry point
# calls (10), Box<dyn Any> arguments (22), a return type the candidate defines (137), md5 (162), rand 0.4's
# gen_range(low, high), gen() and random() in the tests (38, 50), and a plain one (0).
SAMPLE = (0, 10, 22, 38, 50, 137, 162)
# Rust/32's canonical find_zero is Newton's method from 0 on the test's 100 random polynomials: about 1 in 100
# cycles (the test loops to the time limit) or diverges to NaN (the assertion fails), so most runs of the canonical
# fail, here as in the reference (any rand); the buggy one fails as well.
FLAKY = {32: "Newton's method from 0 cycles or diverges on some of the test's random polynomials"}

OK_BODY = """fn has_close_elements(numbers:Vec<f32>, threshold: f32) -> bool{
    for i in 0..numbers.len() { for j in i + 1..numbers.len() {
        if (numbers[i] - numbers[j]).abs() < threshold { return true; } } }
    false
}
"""
SIG = "fn has_close_elements(numbers:Vec<f32>, threshold: f32) -> bool"
WRONG = SIG + "{ return false; }\n"
# Each fools `cargo test` in the reference's layout (the candidate's code sits beside the tests at the crate root).
HACKS = {
    "early exit": SIG + "{ std::process::exit(0) }\n",
    "constructor in .init_array": 'extern "C" fn fixlab_go() { std::process::exit(0) }\n'
                                  '#[link_section = ".init_array"]\n#[used]\n'
                                  'static FIXLAB_INIT: extern "C" fn() = fixlab_go;\n' + WRONG,
    "constructor in global_asm": 'std::arch::global_asm!(".section .init_array,\\"aw\\"", ".quad fixlab_go", ".text",'
                                 ' "fixlab_go:", "mov $231, %eax", "xor %edi, %edi", "syscall", options(att_syntax));\n'
                                 + WRONG,
    "libc exit replaced (no_mangle)": 'extern "C" { fn _exit(code: i32) -> !; }\n#[no_mangle]\n'
                                      'pub extern "C" fn exit(_code: i32) -> ! { unsafe { _exit(0) } }\n' + WRONG,
    "assertion macros redefined": "macro_rules! assert_eq { ($($t:tt)*) => {} }\n"
                                  "macro_rules! assert { ($($t:tt)*) => {} }\n" + WRONG,
    "always-equal return type": "#[derive(Debug)]\nstruct Yes;\n"
                                "impl PartialEq<bool> for Yes { fn eq(&self, _: &bool) -> bool { true } }\n"
                                "fn has_close_elements(numbers:Vec<f32>, threshold: f32) -> Yes { Yes }\n",
    "panic hook exits 0": SIG + "{ std::panic::set_hook(Box::new(|_| std::process::exit(0))); false }\n",
    "a thread exits 0 during the tests": SIG + "{ std::thread::spawn(|| std::process::exit(0)); "
                                         "std::thread::sleep(std::time::Duration::from_secs(2)); false }\n",
    "output muted": 'extern "C" { fn close(fd: i32) -> i32; }\n'
                    + SIG + "{ unsafe { close(1); close(2); } false }\n",
    # Rust/137's tests compare values of a type the candidate defines: fixlab compares its own copy of it
    "always-equal type the tests compare (Rust/137)": (137, """#[derive(Debug)]
pub enum RtnType<S, F, I> { Empty(), String(S), Float(F), Int(I) }
impl<S, F, I> PartialEq for RtnType<S, F, I> { fn eq(&self, _: &Self) -> bool { true } }
fn compare_one<'a>(a:&'a dyn Any, b:&'a dyn Any) -> RtnType<String,f64,i32>{ RtnType::Empty() }
"""),
}


def _code(n: int, kind: str = "canonical") -> tuple[dict, str]:
    row = by_id("rust", n)
    return row, solution(LANG, row, kind)


@pytest.mark.parametrize("n", SAMPLE)
def test_canonical_solutions_pass(sandbox, n):
    row, code = _code(n)
    res = run(sandbox, LANG, code, row)
    assert res.status == "passed", (res.stderr[-500:], res.details)
    assert res.details["compile_s"] > 0 and res.details["run_s"] >= 0  # compiling and running timed apart


@pytest.mark.parametrize("n", SAMPLE)
def test_buggy_solutions_fail(sandbox, n):
    row, code = _code(n, "buggy")
    res = run(sandbox, LANG, code, row)
    assert res.status in ("failed", "timeout"), res.details


@pytest.fixture(scope="module")
def hack_runs(sandbox):
    """Each hack for task 0 in the reference's layout and in fixlab's, two programs at a time (the sandbox's two
    workers): cargo's check and test builds make the reference's runs the file's slowest part."""
    from concurrent.futures import ThreadPoolExecutor

    jobs = [(name, which) for name in HACKS for which in ("reference", "fixlab")]

    def one(job):
        name, which = job
        n, code = HACKS[name] if isinstance(HACKS[name], tuple) else (0, HACKS[name])
        row = by_id("rust", n)
        if which == "reference":
            return sandbox.run(LANG.reference_as_program(code, row["test"], task(row)), 10)
        return run(sandbox, LANG, code, row)

    with ThreadPoolExecutor(2) as pool:
        return dict(zip(jobs, pool.map(one, jobs)))


@pytest.mark.parametrize("name", sorted(HACKS))
def test_a_hack_passes_the_reference_and_fails_here(hack_runs, name):
    ref, res = hack_runs[name, "reference"], hack_runs[name, "fixlab"]
    if name != "output muted":  # muting hides the assertion's message; the reference still sees the exit code
        assert ref.exit_code == 0 and LANG.reference_pass(ref.exit_code, ref.stdout, ref.stderr), \
            f"{name}: the reference's own verdict should be fooled ({ref.exit_code}, {ref.stderr[-300:]})"
    assert res.status == "failed", (name, res.status, res.stderr[-300:])


def test_a_compile_error_is_a_failure_with_the_compilers_message(sandbox):
    row = by_id("rust", 0)
    res = run(sandbox, LANG, SIG + "{\n    return nope;\n}\n", row)
    assert res.status == "failed" and res.details["stage"] == "compile" and res.error_type == "CompileError"
    assert "cannot find value `nope`" in res.details["failure"] and "candidate.rs:2" in res.details["failure"]
    assert res.failing_line == "return nope;"


def test_an_assertion_names_its_line(sandbox):
    row = by_id("rust", 0)
    res = run(sandbox, LANG, WRONG, row)
    assert res.status == "failed" and res.error_type == "AssertionError"
    assert res.failing_line == "assert_eq!(has_close_elements(vec![11.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.3), true);"
    assert "left: `false`" in res.details["failure"] and "right: `true`" in res.details["failure"]


def test_overflow_panics_as_in_a_debug_build(sandbox):
    row = by_id("rust", 0)
    res = run(sandbox, LANG, SIG + "{\n    let x: u8 = 250 + numbers.len() as u8;\n    x > 0\n}\n", row)
    assert res.status == "failed" and res.error_type == "Panic", res.details
    assert "attempt to add with overflow" in res.details["failure"]
    assert res.failing_line == "let x: u8 = 250 + numbers.len() as u8;"


def test_the_correct_fix_passes(sandbox):
    row = by_id("rust", 0)
    assert run(sandbox, LANG, OK_BODY, row).status == "passed"


@pytest.mark.parametrize("code,status", [
    ("fn main(){}\n" + OK_BODY, "passed"),  # the answer's own main is a function of its module, unused
    (OK_BODY + "fn main() { panic!() }\nfn main() {}\n", "passed"),  # cut before a second main, as the reference
    (OK_BODY + "}\nfn main() {}\nmod x {\n", "failed"),  # include! reads items: the module cannot be closed early
])
def test_the_answer_stays_in_its_module(sandbox, code, status):
    row = by_id("rust", 0)
    res = run(sandbox, LANG, code, row)
    assert res.status == status, res.details


@pytest.mark.parametrize("code,what", [
    ("fn has_close_elements(numbers:Vec<f32>, threshold: f32) -> bool{ ::fixlab_proof::run(&[]) }\n", "harness"),
    ('fn has_close_elements(numbers:Vec<f32>, threshold: f32) -> bool{ std::fs::read("/proc/self/fd/4").is_ok() }\n',
     "std::fs::"),
    ('fn has_close_elements(numbers:Vec<f32>, threshold: f32) -> bool{ '
     'std::net::TcpStream::connect("1.1.1.1:80").is_ok() }\n', "std::net::"),
    ('fn has_close_elements(numbers:Vec<f32>, threshold: f32) -> bool{ '
     'std::process::Command::new("/bin/true").status().is_ok() }\n', "std::process::Command"),
])
def test_files_sockets_processes_and_the_harness_are_refused(sandbox, code, what):
    row = by_id("rust", 0)
    res = run(sandbox, LANG, code, row)
    assert res.status == "failed" and res.error_type == "PolicyError" and what in res.details["failure"], res.details


PROBE = """fn has_close_elements(numbers:Vec<f32>, threshold: f32) -> bool {
    let c = std::net::TcpStream::connect("1.1.1.1:80").is_ok();
    let w = std::fs::write("%s", "x").is_ok();
    println!("connect={} write={}", c, w);
    false
}
"""


def test_no_network_and_no_write_outside_scratch(sandbox, tmp_path):
    # the object check refuses this code in fixlab's programs; in the reference's own layout it runs, in the jail
    row = by_id("rust", 0)
    target = tmp_path / "escaped"
    ref = sandbox.run(LANG.reference_as_program(PROBE % target, row["test"], task(row)), 10)
    assert "connect=false write=false" in ref.stdout, (ref.stdout[-300:], ref.stderr[-300:])
    assert not target.exists()


def test_a_thread_is_refused(sandbox):
    # refused in the object; the run step could not start one either (RLIMIT_NPROC 1)
    row = by_id("rust", 0)
    res = run(sandbox, LANG, SIG + "{ std::thread::spawn(|| ()).join().is_ok() }\n", row)
    assert res.status == "failed" and res.error_type == "PolicyError" and "std::thread" in res.details["failure"]


def test_a_program_that_never_ends_is_stopped_and_leaves_nothing(sandbox):
    from sandboxes.procs import processes_of_uids

    row = by_id("rust", 0)
    prog = LANG.program(SIG + "{ loop {} }\n", row["test"], task(row))
    short = type(prog)(prog.language, prog.files, prog.steps[:-1] + (
        type(prog.steps[-1])(**{**prog.steps[-1].__dict__, "timeout_s": 1.0}),), prog.shown_file)
    res = sandbox.run(short, 10)
    assert res.status == "timeout"
    uids = range(sandbox.uid_base, sandbox.uid_base + sandbox.workers)
    assert processes_of_uids(uids) == []


RAND_04 = """fn has_close_elements(numbers:Vec<f32>, threshold: f32) -> bool {
    let mut rng = rand::thread_rng();
    let (a, b): (u8, f64) = (rng.gen_range(b'a', b'z' + 1), rng.gen_range(0.0, 1.0));
    let mut v: Vec<i32> = (0..10).map(|_| rng.gen::<i32>() % 7).collect();
    rng.shuffle(&mut v);
    let word: String = rng.gen_ascii_chars().take(4).collect();
    let picked = rng.choose(&v).copied().unwrap_or(0) + rand::random::<u32>() as i32 % 2;
    let _ = (a, b, word, picked, rng.gen_weighted_bool(3), rand::weak_rng().next_u32(), rand::StdRng::new());
    let mut sorted = numbers.clone();
    sorted.sort_by(|x, y| x.partial_cmp(y).unwrap());
    sorted.windows(2).any(|w| w[1] - w[0] < threshold)
}
"""


def test_the_rand_04_api(sandbox):
    # the reference pinned rand 0.4 (Rust/32's and /50's tests call gen_range(low, high)); Debian has 0.8.5 only
    row = by_id("rust", 0)
    res = run(sandbox, LANG, RAND_04, row)
    assert res.status == "passed", (res.details.get("failure"), res.stderr[-500:])
    files, commands = LANG.reference_program(RAND_04, row["test"], task(row))
    assert 'rand = "0.4"' in files["Cargo.toml"] and commands[-1][1:] == ["test", "--bin", "test"]
