"""The rule that picks issue 17's "today's suite" (benchmarks/old_suite.py); nothing is run."""

from __future__ import annotations

from benchmarks.old_suite import descendants, names_of_tests, split_nodeid

MODULE = """
def test_top(): pass
async def test_async(): pass
def helper(): pass
class TestGroup:
    def test_inner(self): pass
    def helper(self): pass
class Other:
    def test_not_collected(self): pass
"""


def test_a_modules_tests_are_its_test_functions_and_test_class_methods() -> None:
    assert names_of_tests(MODULE) == {"test_top", "test_async", "test_inner"}


def test_a_node_id_splits_into_file_and_function() -> None:
    assert split_nodeid("tests/a/test_b.py::TestC::test_d[x-1]") == ("tests/a/test_b.py", "test_d")
    assert split_nodeid("tests/test_e.py::test_f") == ("tests/test_e.py", "test_f")


def test_descent_follows_files_renames_and_moved_tests() -> None:
    old = {
        "tests/test_kept.py": {"test_kept", "test_moved_out"},
        "tests/test_renamed.py": {"test_renamed"},
        "tests/test_gone.py": {"test_elsewhere"},
    }
    new = {
        "tests/test_kept.py": {"test_kept", "test_new"},
        "tests/sub/test_renamed.py": {"test_renamed"},
        "tests/test_split.py": {"test_moved_out", "test_elsewhere", "test_kept"},
    }
    moves = {"tests/test_renamed.py": {"tests/sub/test_renamed.py"}}
    ids = [
        "tests/test_kept.py::test_kept[1]",
        "tests/test_kept.py::test_kept[2]",
        "tests/test_kept.py::test_new",
        "tests/sub/test_renamed.py::test_renamed",
        "tests/test_split.py::TestMoved::test_moved_out",
        "tests/test_split.py::test_elsewhere",
        # Still in its old file: a namesake elsewhere is a new test.
        "tests/test_split.py::test_kept",
    ]
    assert descendants(old, new, moves, ids) == [
        "tests/test_kept.py::test_kept[1]",
        "tests/test_kept.py::test_kept[2]",
        "tests/sub/test_renamed.py::test_renamed",
        "tests/test_split.py::TestMoved::test_moved_out",
        "tests/test_split.py::test_elsewhere",
    ]
