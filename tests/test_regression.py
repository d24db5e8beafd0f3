"""Generated pytest modules cannot be steered by the data they carry (issue 30, item 8).

:func:`corral.regression.pytest_module` writes episode data and the caller's values
into a module; whatever those strings hold (quotes of every kind, newlines, ``'''#``,
``\"\"\"``, backslashes, Unicode line breaks, code), the module must compile, its syntax
tree must be the template's with only the literals changed, and importing it must give
back exactly the data it was given. Hypothesis writes the strings.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.episodes import EnvInfo, Header, StepRecord, read
from corral.regression import pytest_module

TARGET = re.compile(r"[\w.]+:[\w.]+")
HOSTILE = [
    '"""',
    "'''#",
    "\\",
    "\n",
    "\r",
    "\u2028",
    "\x00",
    "'''\nimport os; os.system('touch /tmp/pwned')\n'''",
    '"""\nraise SystemExit(3)\n"""',
    "{url}",
    "{0}",
]
texts = st.text() | st.sampled_from(HOSTILE) | st.lists(st.sampled_from(HOSTILE)).map("".join)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**60), 2**60) | texts,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=8,
)


@st.composite
def episode_files(draw: Any) -> list[str]:
    """The lines of an episode file whose every string field is drawn."""
    header = Header(
        env=EnvInfo(
            name=draw(texts),
            contract_version=draw(st.none() | texts),
            fingerprint=draw(st.none() | texts),
        ),
        source=draw(texts),
        url=draw(st.none() | texts),
        meta=draw(st.dictionaries(texts, json_values, max_size=2)),
    )
    lines = [header.model_dump_json()]
    for n in range(draw(st.integers(1, 3))):
        episode = f"{draw(texts)}#{n}"  # an episode id names one episode of the file
        session = draw(st.none() | texts)
        seed = draw(st.none() | st.integers(0, 2**31))
        lines.append(
            StepRecord(
                episode=episode,
                session=session,
                index=0,
                op="reset",
                seed=seed,
                options=draw(st.dictionaries(texts, json_values, max_size=2)),
                observation=draw(st.dictionaries(texts, json_values, max_size=2)),
            ).model_dump_json()
        )
        for index in range(1, draw(st.integers(1, 3))):
            lines.append(
                StepRecord(
                    episode=episode,
                    session=session,
                    index=index,
                    op="step",
                    seed=seed,
                    action=draw(st.dictionaries(texts, json_values, max_size=2)),
                    observation=draw(st.dictionaries(texts, json_values, max_size=2)),
                    reward=draw(st.none() | st.floats(-1e6, 1e6)),
                ).model_dump_json()
            )
    return lines


def skeleton(source: str) -> str:
    """The module's syntax tree with every literal blanked and the data lists cut to one
    element: what is left is the code, which data must never change."""
    tree = ast.parse(source)
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            value = node.value
            if name == "EPISODES" and isinstance(value, ast.Call):
                value.args[0].elts = value.args[0].elts[:1]  # type: ignore[attr-defined]
            elif name == "IDS" and isinstance(value, ast.List):
                value.elts = value.elts[:1]
            elif name == "IGNORE" and isinstance(value, ast.Tuple):
                value.elts = []

    class Blank(ast.NodeTransformer):
        def visit_Constant(self, node: ast.Constant) -> ast.AST:
            return (
                ast.Constant("literal")
                if node.value is None or isinstance(node.value, str)
                else node
            )

    return ast.dump(Blank().visit(tree))


BASELINE = skeleton(
    pytest_module(
        read(
            [
                Header().model_dump_json(),
                StepRecord(episode="e", index=0, op="reset", observation={}).model_dump_json(),
            ]
        ),
        url="http://127.0.0.1:1",
        env="pkg.mod:Env",
        ignore=["metadata"],
        source="a file",
    )
)


def load(source: str) -> dict[str, Any]:
    """Import the module's text (exec in a fresh namespace, as an import would)."""
    namespace: dict[str, Any] = {"__name__": "test_generated"}
    exec(compile(source, "test_generated.py", "exec"), namespace)
    return namespace


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    lines=episode_files(),
    url=st.none() | texts,
    env=st.none() | texts,
    ignore=st.lists(texts, max_size=3),
    source=texts,
)
def test_no_string_in_the_data_changes_the_code(
    lines: list[str], url: str | None, env: str | None, ignore: list[str], source: str
) -> None:
    episodes = read(lines)
    if env is not None and not TARGET.fullmatch(env):
        with pytest.raises(ValueError, match="module:Class"):
            pytest_module(episodes, url=url, env=env, ignore=ignore, source=source)
        env = None
    module = pytest_module(episodes, url=url, env=env, ignore=ignore, source=source)
    assert module.isascii()  # no odd line break can hide in it
    assert skeleton(module) == BASELINE
    loaded = load(module)
    assert loaded["URL"] == url and loaded["ENV"] == env
    assert loaded["IGNORE"] == tuple(ignore)
    first = episodes[0].header.env
    assert first.name in loaded["ABOUT"] and source in loaded["ABOUT"]
    back = loaded["EPISODES"]
    assert [e.id for e in back] == [e.id for e in episodes]
    assert [e.header.model_dump() for e in back] == [e.header.model_dump() for e in episodes]
    assert [[r.model_dump() for r in e.records] for e in back] == [
        [r.model_dump() for r in e.records] for e in episodes
    ]
    assert len(loaded["IDS"]) == len(episodes)
    assert all(re.fullmatch(r"[A-Za-z0-9_.-]+", i) for i in loaded["IDS"])


def test_the_reported_injections_stay_data() -> None:
    # The audit's probes: a """ in the name, and a url with '''# that ran code on import.
    header = Header(env=EnvInfo(name='x"""\nimport os\n"""', fingerprint="'''#"))
    lines = [
        header.model_dump_json(),
        StepRecord(episode="e", index=0, op="reset", observation={}).model_dump_json(),
    ]
    url = "http://127.0.0.1:1/'''#\nraise SystemExit(3)\n'''"
    module = pytest_module(read(lines), url=url, source='"""; import os')
    loaded = load(module)
    assert loaded["URL"] == url
    assert json.loads(lines[0])["env"]["name"] in loaded["ABOUT"]
    assert skeleton(module) == BASELINE
