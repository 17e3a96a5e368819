"""Code extraction: fenced or bare code, the entry point with what it needs, the task's context, no echoed tests."""
from __future__ import annotations

import ast

from agents.extract import extract_candidate, normalise
from agents_fixtures import task
from conftest import needs_data

pytestmark = needs_data

FIX2 = "def truncate_number(number: float) -> float:\n    return number % 1.0\n"


def test_fenced_block_defining_the_entry_point_wins():
    t = task(2)
    text = "First an idea:\n```python\nx = 1\n```\nNow the fix:\n```python\n" + FIX2 + "```\nDone."
    ex = extract_candidate(text, t)
    assert ex.problem is None and ex.code.strip() == FIX2.strip()


def test_unclosed_fence_counts():  # the answer hit max_new_tokens after the code
    ex = extract_candidate("```python\n" + FIX2, task(2))
    assert ex.problem is None and "return number % 1.0" in ex.code


def test_bare_code_with_trailing_prose_is_cut_until_it_parses():
    ex = extract_candidate("The fix is below.\n" + FIX2 + "\nThis removes the + 1.0 that was wrong.", task(2))
    assert ex.problem is None and ex.code.strip() == FIX2.strip()


def test_echoed_tests_and_demo_calls_are_dropped():
    t = task(2)
    code = FIX2 + "\n\ndef check(f):\n    assert f(3.5) == 0.5\n\ncheck(truncate_number)\nassert truncate_number(1.5) == 0.5\n" \
        "print(truncate_number(2.5))\nresult = truncate_number(1.0)\nif __name__ == '__main__':\n    print(1)\n"
    ex = extract_candidate("```python\n" + code + "```", t)
    assert ex.problem is None
    names = [type(n).__name__ for n in ast.parse(ex.code).body]
    assert names == ["FunctionDef"], ex.code


def test_task_context_helpers_and_imports_survive():
    t = task(38)  # decode_cyclic needs encode_cyclic from the declaration
    ex = extract_candidate("```python\ndef decode_cyclic(s: str):\n    return encode_cyclic(encode_cyclic(s))\n```", t)
    assert ex.problem is None and "def encode_cyclic" in ex.code
    t0 = task(0)  # `from typing import List` comes back, once
    ex = extract_candidate("```python\nfrom typing import List\ndef has_close_elements(numbers: List[float], threshold: float) -> bool:\n"
                           "    return False\n```", t0)
    assert ex.code.count("from typing import List") == 1
    ex = extract_candidate("```python\ndef has_close_elements(numbers, threshold):\n    return False\n```", t0)
    assert ex.code.startswith("from typing import List")
    assert extract_candidate("```python\ndef has_close_elements(numbers, threshold):\n    return False\n```", t0,
                             keep_context=False).code.startswith("def ")


def test_helper_from_another_block_is_brought_in():
    t = task(2)
    text = ("```python\ndef frac(x):\n    return x % 1.0\n```\nand\n```python\n"
            "def truncate_number(number: float) -> float:\n    return frac(number)\n```")
    ex = extract_candidate(text, t)
    assert ex.problem is None and "def frac" in ex.code


def test_harness_names_come_from_the_import_helper():
    """What a candidate may use unimported is read off IMPORT_HELPER, star imports included."""
    from sandboxes.program import HELPER_NAMES

    assert {"math", "re", "collections", "numpy", "np", "List", "Optional", "Counter", "deque"} <= HELPER_NAMES

def test_body_only_answer_goes_under_the_task_signature():
    ex = extract_candidate("```python\n    return number % 1.0\n```", task(2))
    assert ex.problem is None and ex.code.startswith("def truncate_number(number: float) -> float:")


def test_problems_are_named():
    t = task(2)
    assert extract_candidate("I think the modulo is wrong.", t).problem == "no_code"
    bad = extract_candidate("```python\ndef truncate_number(number):\n    return number %% 1.0 +\n```", t)
    assert bad.problem == "syntax" and "SyntaxError" in bad.detail
    other = extract_candidate("```python\ndef truncate(number):\n    return number % 1.0\n```", t)
    assert other.problem == "signature" and "truncate_number" in other.detail
    two = extract_candidate("```python\ndef truncate_number(number, digits):\n    return number % 1.0\n```", t)
    assert two.problem == "signature" and "def truncate_number(number)" in two.detail
    ok = extract_candidate("```python\ndef truncate_number(number, digits=2):\n    return number % 1.0\n```", t)
    assert ok.problem is None  # an extra parameter with a default still fits the tests' calls
    assert extract_candidate("```python\ndef truncate_number(number):\n    return 1\n```\n", t,
                             check_signature=False).problem is None


def test_normalise_ignores_layout_comments_and_docstrings():
    a = 'def f(x):\n    """Doc."""\n    # why\n    return x+1\n'
    b = "def f(x):\n\n    return (x + 1)  # other comment\n"
    assert normalise(a) == normalise(b)
    assert normalise(a) != normalise("def f(x):\n    return x - 1\n")
