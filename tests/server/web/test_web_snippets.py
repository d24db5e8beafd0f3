"""Code the page writes from data reads back as that data (issue 30, item 8): pyLiteral's
output, parsed by Python's own parser, is the value it was given; a "Copy as Python"
snippet with generated URLs, options and actions holds them in literals and calls only
what the template calls. The values come from hypothesis; the page's own module writes
the code, in Chromium."""

from __future__ import annotations

import ast
import json
import math
from typing import Any

import pytest

pytest.importorskip("playwright")

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.support.browser import open_ui
from tests.support.servers import running

from corral.envs.echo import EchoEnv

pytestmark = [pytest.mark.browser, pytest.mark.asyncio(loop_scope="session")]

SAFE = 2**53 - 1  # JavaScript numbers hold integers exactly up to here
scalars = (
    st.none()
    | st.booleans()
    | st.integers(-SAFE, SAFE)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)
CALLS = {"asyncio.run", "main", "AsyncEnvClient", "env.reset", "env.step", "print", "env.state"}


def collect(strategy: Any, n: int) -> list[Any]:
    """``n`` examples of ``strategy``, drawn by hypothesis (its edge cases included)."""
    out: list[Any] = []

    @settings(max_examples=n, database=None, suppress_health_check=list(HealthCheck))
    @given(strategy)
    def draw(value: Any) -> None:
        out.append(value)

    draw()
    return out


def same(a: Any, b: Any) -> bool:
    """JSON equality, with -0.0 and 0.0 told apart and bools never taken for ints."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, float) or isinstance(b, float):
        return float(a) == float(b) and math.copysign(1, a) == math.copysign(1, b)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


async def snippets(page: Any, function: str, args: list[Any]) -> list[str]:
    # As JSON text, parsed in the page as the UI parses what it receives (a key named
    # __proto__ stays a key; Playwright's own transfer would make it the prototype).
    return await page.evaluate(
        f"""async (text) => {{
            const m = await import('./snippets.js');
            return JSON.parse(text).map((a) => m.{function}(...a));
        }}""",
        json.dumps(args),
    )


@pytest.fixture(scope="module")
def echo():
    with running(EchoEnv, web=True) as srv:
        yield srv


async def test_py_literals_read_back_as_their_values(context, echo):
    ctx, _ = context
    page = await open_ui(ctx, echo.url)
    values = collect(json_values, 300)
    written = await snippets(page, "pyLiteral", [[v] for v in values])
    for value, literal in zip(values, written, strict=True):
        assert literal.isascii(), literal
        assert same(_ints(ast.literal_eval(literal)), _ints(value)), (value, literal)


def _ints(value: Any) -> Any:
    """JavaScript has one number type: an integral float is written as an int."""
    if (
        isinstance(value, float)
        and value.is_integer()
        and not (value == 0 and math.copysign(1, value) < 0)
    ):
        return int(value)
    if isinstance(value, list):
        return [_ints(v) for v in value]
    if isinstance(value, dict):
        return {k: _ints(v) for k, v in value.items()}
    return value


async def test_a_python_snippet_holds_data_in_literals_only(context, echo):
    ctx, _ = context
    page = await open_ui(ctx, echo.url)
    cases = collect(
        st.tuples(
            st.text(),
            st.dictionaries(st.text(), json_values, max_size=3),
            st.lists(st.dictionaries(st.text(), json_values, max_size=3), max_size=3),
            st.none() | st.integers(0, SAFE),
        ),
        60,
    )
    args = [
        [
            {
                "seed": seed,
                "options": options,
                "steps": [{"kind": "reset"}, *({"kind": "step", "action": a} for a in actions)],
            },
            len(actions),
            {"url": url},
        ]
        for url, options, actions, seed in cases
    ]
    written = await snippets(page, "pythonSnippet", args)
    for (url, options, actions, seed), source in zip(cases, written, strict=True):
        tree = ast.parse(source)
        calls = {ast.unparse(node.func) for node in ast.walk(tree) if isinstance(node, ast.Call)}
        assert calls <= CALLS, calls - CALLS
        client = next(
            n
            for n in ast.walk(tree)
            if isinstance(n, ast.Call) and ast.unparse(n.func) == "AsyncEnvClient"
        )
        assert ast.literal_eval(client.args[0]) == url
        steps = [
            n
            for n in ast.walk(tree)
            if isinstance(n, ast.Call) and ast.unparse(n.func) == "env.step"
        ]
        assert len(steps) == len(actions)
        for step, action in zip(steps, actions, strict=True):
            assert same(_ints(ast.literal_eval(step.args[0])), _ints(action)), action
        reset = next(
            n
            for n in ast.walk(tree)
            if isinstance(n, ast.Call) and ast.unparse(n.func) == "env.reset"
        )
        assert ast.literal_eval(reset.keywords[0].value) == seed
        if options:
            assert same(_ints(ast.literal_eval(reset.keywords[1].value)), _ints(options))
