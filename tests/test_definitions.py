"""The definitions store (SPEC §2.1): every problem reported with file and line, broken tools kept apart."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from worker import cli
from worker.definitions import file_store
from worker.definitions.file_store import SUFFIXES
from worker.definitions.model import Problem, Source, ToolSet

DEFINITIONS = Path(__file__).resolve().parent.parent / "definitions"
REPO_FILES = sorted(p for p in DEFINITIONS.rglob("*") if p.suffix in SUFFIXES and p.is_file())

UPSTREAM = """\
upstreams:
  api:
    base_url: https://api.example.com
"""

GOOD_TOOL = """\
  - name: good
    upstream: api
    input_schema:
      type: object
      properties:
        id: {type: string}
    request:
      method: GET
      path: /items/${id}
"""


def write(directory: Path, name: str, text: str) -> Path:
    path = directory / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def line_of(path: Path, needle: str) -> int:
    """The 1-based line of the first line containing `needle`."""
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if needle in line:
            return number
    raise AssertionError(f"{needle!r} not in {path}")


def problems_for(toolset: ToolSet, path: Path) -> list[Problem]:
    return [p for p in toolset.problems if p.source.file == str(path)]


def assert_problem(toolset: ToolSet, path: Path, line: int, *words: str) -> Problem:
    """A problem of `path` at `line` mentions all `words`, and its text starts with `file:line:`."""
    here = [p for p in problems_for(toolset, path) if p.source.line == line]
    matching = [p for p in here if all(w in p.message for w in words)]
    assert matching, (line, words, [str(p) for p in toolset.problems])
    problem = matching[0]
    assert str(problem).startswith(f"{path}:{line}: ")
    return problem


@pytest.mark.parametrize("path", REPO_FILES, ids=[str(p.relative_to(DEFINITIONS)) for p in REPO_FILES])
def test_repo_definitions_load_without_problems(path: Path) -> None:
    """Every example definitions file in the repository loads with tools and no problems."""
    toolset = file_store.load([path], environ={})
    assert toolset.problems == []
    assert toolset.unusable == {}
    assert toolset.tools


def test_repo_definitions_folder_loads_as_a_whole() -> None:
    """The whole `definitions/` folder loads together without problems (no duplicates across files)."""
    toolset = file_store.load([DEFINITIONS], environ={})
    assert [str(p) for p in toolset.problems] == []


def test_yaml_syntax_error_has_file_and_line(tmp_path: Path) -> None:
    """A YAML syntax error is one problem at the line of the error; other files still load."""
    bad = write(
        tmp_path,
        "bad.yaml",
        UPSTREAM
        + textwrap.dedent(
            """\
            tools:
              - name: broken
                upstream: api: nope
            """
        ),
    )
    good = write(
        tmp_path, "good.yaml", UPSTREAM.replace("api:", "other:") + "tools:\n" + GOOD_TOOL.replace("api", "other")
    )
    toolset = file_store.load([tmp_path], environ={})
    assert len(problems_for(toolset, bad)) == 1
    assert problems_for(toolset, bad)[0].source.line == line_of(bad, "upstream: api: nope")
    assert problems_for(toolset, good) == []
    assert "good" in toolset.tools


def test_json_syntax_error_has_file_and_line(tmp_path: Path) -> None:
    """A JSON syntax error is reported with the file and the line of the error."""
    bad = write(tmp_path, "bad.json", '{\n  "upstreams": {},\n  "tools": [\n    {"name": "x",}\n  ]\n}\n')
    toolset = file_store.load([bad], environ={})
    assert len(toolset.problems) == 1
    assert toolset.problems[0].source == Source(str(bad), 4)


TOOL_PROBLEMS = {
    "unknown upstream": (
        """\
        - name: broken
          upstream: nowhere
        """,
        "name: broken",
        ["nowhere"],
    ),
    "undeclared argument": (
        """\
        - name: broken
          upstream: api
          input_schema: {type: object, properties: {id: {type: string}}}
          request: {path: "/items/${item_id}"}
        """,
        "name: broken",
        ["item_id"],
    ),
    "invalid schema": (
        """\
        - name: broken
          upstream: api
          input_schema:
            type: object
            properties:
              id: {type: strng}
        """,
        "name: broken",
        ["input_schema", "strng"],
    ),
    "invalid jmespath": (
        """\
        - name: broken
          upstream: api
          response:
            transform: {jmespath: "items[?status =="}
        """,
        "name: broken",
        ["JMESPath"],
    ),
    "bad method": (
        """\
        - name: broken
          upstream: api
          request:
            method: FETCH
        """,
        "name: broken",
        ["FETCH"],
    ),
    "bad tool name": (
        """\
        - name: "broken tool!"
          upstream: api
        """,
        "broken tool!",
        ["name"],
    ),
    "unknown key in a tool": (
        """\
        - name: broken
          upstream: api
          reqest: {method: GET}
        """,
        "reqest",
        ["reqest"],
    ),
    "unknown key in a request": (
        """\
        - name: broken
          upstream: api
          request:
            methd: GET
        """,
        "methd",
        ["methd"],
    ),
}


def tools_file(tmp_path: Path, *tools: str, name: str = "tools.yaml") -> Path:
    body = "".join(textwrap.indent(textwrap.dedent(t), "  ") for t in tools)
    return write(tmp_path, name, UPSTREAM + "tools:\n" + body)


@pytest.mark.parametrize(("tool", "needle", "words"), TOOL_PROBLEMS.values(), ids=TOOL_PROBLEMS.keys())
def test_tool_problem_has_file_and_line(tmp_path: Path, tool: str, needle: str, words: list[str]) -> None:
    """Each kind of broken tool is reported once, with its file and the line of the offending node."""
    path = tools_file(tmp_path, GOOD_TOOL, tool)
    toolset = file_store.load([path], environ={})
    assert len(problems_for(toolset, path)) == 1, [str(p) for p in toolset.problems]
    assert_problem(toolset, path, line_of(path, needle), *words)
    assert "good" in toolset.tools
    assert "broken" not in toolset.tools


@pytest.mark.parametrize(
    "kind",
    [kind for kind in TOOL_PROBLEMS if kind != "bad tool name"],  # an invalid name names no callable tool
)
def test_broken_tool_is_unusable_and_the_others_load(tmp_path: Path, kind: str) -> None:
    """A broken tool is listed in `unusable` (exit 78 when called) while valid tools of the file load."""
    tool, _, _ = TOOL_PROBLEMS[kind]
    path = tools_file(tmp_path, GOOD_TOOL, tool)
    toolset = file_store.load([path], environ={})
    assert set(toolset.tools) == {"good"}
    assert "broken" in toolset.unusable
    assert toolset.unusable["broken"]


def test_duplicate_tool_name_across_files(tmp_path: Path) -> None:
    """A tool name defined in two files is a problem naming the tool, with file and line."""
    first = tools_file(tmp_path, GOOD_TOOL, name="a.yaml")
    second = write(tmp_path, "b.yaml", "tools:\n" + GOOD_TOOL)
    toolset = file_store.load([tmp_path], environ={})
    duplicates = [p for p in toolset.problems if "good" in p.message and "duplicate" in p.message.lower()]
    assert len(duplicates) == 1, [str(p) for p in toolset.problems]
    problem = duplicates[0]
    assert problem.source.file in {str(first), str(second)}
    assert problem.source.line == line_of(Path(problem.source.file), "name: good")
    assert "good" in toolset.tools


def test_duplicate_tool_name_in_one_file(tmp_path: Path) -> None:
    """A tool name used twice in one file is reported at the second definition."""
    path = tools_file(tmp_path, GOOD_TOOL, GOOD_TOOL)
    toolset = file_store.load([path], environ={})
    second_line = [n for n, line in enumerate(path.read_text().splitlines(), 1) if "name: good" in line][1]
    assert_problem(toolset, path, second_line, "good")


def test_every_problem_of_a_file_is_reported(tmp_path: Path) -> None:
    """All problems of a file are reported at once, each at its own line, not just the first."""
    tools = [tool.replace("broken", f"broken{i}") for i, (tool, _, _) in enumerate(TOOL_PROBLEMS.values())]
    path = tools_file(tmp_path, GOOD_TOOL, *tools)
    toolset = file_store.load([path], environ={})
    for i, (_, needle, words) in enumerate(TOOL_PROBLEMS.values()):
        assert_problem(toolset, path, line_of(path, needle.replace("broken", f"broken{i}")), *words)
    assert set(toolset.tools) == {"good"}


def test_two_problems_of_one_tool_are_both_reported(tmp_path: Path) -> None:
    """A tool with several problems gets them all, not only the first."""
    path = tools_file(
        tmp_path,
        """\
        - name: broken
          upstream: nowhere
          input_schema: {type: object, properties: {}}
          request: {path: "/items/${item_id}"}
        """,
    )
    toolset = file_store.load([path], environ={})
    messages = " | ".join(p.message for p in problems_for(toolset, path))
    assert "nowhere" in messages and "item_id" in messages


def test_unknown_key_in_an_upstream(tmp_path: Path) -> None:
    """A typo in an upstream is reported at its line."""
    path = write(tmp_path, "u.yaml", "upstreams:\n  api:\n    base_url: https://x.example\n    timeout_secs: 3\n")
    toolset = file_store.load([path], environ={})
    assert_problem(toolset, path, 4, "timeout_secs")


def test_cli_validate_prints_every_problem(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`toolworker validate PATH` exits non-zero and prints each problem with file and line to stderr."""
    path = tools_file(tmp_path, GOOD_TOOL, *(tool for tool, _, _ in TOOL_PROBLEMS.values()))
    expected = [str(p) for p in file_store.load([path], environ={}).problems]
    assert len(expected) >= len(TOOL_PROBLEMS)
    code = cli.main(["validate", str(path)])
    err = capsys.readouterr().err
    assert code != 0
    for problem in expected:
        assert problem in err
    assert err.count(f"{path}:") >= len(TOOL_PROBLEMS)


def test_cli_validate_reports_syntax_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`toolworker validate` reports a file that does not parse, with its line."""
    path = write(tmp_path, "bad.yaml", "tools:\n  - name: [unclosed\n")
    code = cli.main(["validate", str(path)])
    assert code != 0
    assert f"{path}:" in capsys.readouterr().err


def test_cli_validate_repo_definitions(capsys: pytest.CaptureFixture[str]) -> None:
    """`toolworker validate definitions/` exits 0 and prints no problem; only the notice that the demo's MCP
    upstream has not been listed (files checked on their own are not looked up in the fleet's listings)."""
    assert cli.main(["validate", str(DEFINITIONS)]) == 0
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("notice: ") and "'desk' has no tools" in lines[0]
