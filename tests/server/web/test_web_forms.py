"""Forms from schemas (every kind of field), the JSON editor, arrays on a canvas, tools."""

from __future__ import annotations

import json
from typing import Any

import pytest

pytest.importorskip("playwright")

from playwright.async_api import expect
from pydantic import BaseModel, Field
from tests.support.browser import js, open_ui, screenshot
from tests.support.servers import running
from tests.support.web_envs import IMAGE, CalcEnv, SinkEnv

from corral.contract import Action, Environment, Observation, State
from corral.envs.echo import EchoEnv

MASK = "\u2022" * 6  # how the UI shows a secret-looking field's value
TIMES = "\u00d7"  # the multiplication sign the UI writes shapes with

pytestmark = [pytest.mark.browser, pytest.mark.asyncio(loop_scope="session")]


@pytest.fixture(scope="module")
def sink():
    with running(SinkEnv, web=True) as srv:
        yield srv


async def test_every_kind_of_field_gets_its_widget(context, sink):
    ctx, _ = context
    page = await open_ui(ctx, sink.url)
    form = page.locator("#action")
    kinds = {
        "#action-colour": "select",
        "#action-flag": "checkbox",
        "#action-level": "number",
        "#action-ratio": "number",
        "#action-name": "text",
        "#action-code": "textarea",
        "#action-api_key": "password",
        "#action-where-x": None,
    }
    for selector, kind in kinds.items():
        if kind is None:
            continue
        found = await page.eval_on_selector(
            selector, "el => el.tagName === 'INPUT' ? el.type : el.tagName.toLowerCase()"
        )
        assert found == kind, selector
    colours = await page.eval_on_selector_all("#action-colour option", "os => os.map(o => o.text)")
    assert colours == ["red", "green", "blue"]
    # An Enum class is a select; a Literal of a few values, radios.
    await expect(form.locator("#action-mode .tab")).to_have_text(["fast", "slow"])
    await expect(form.locator("#action-mode-0")).to_be_checked()
    # A bounded number gets a slider too; nested models are fieldsets; lists add rows.
    await expect(form.locator(".field[data-path=level] input[type=range]")).to_have_count(1)
    await expect(form.locator(".field[data-path=ratio] input[type=range]")).to_have_count(0)
    await expect(form.locator("fieldset[data-path=where] legend")).to_have_text("where")
    await expect(form.locator("#action-where\\.x")).to_have_value("0")
    await expect(form.locator("fieldset.list[data-path=tags] button")).to_have_text("+ add")
    # Optional → a "set" toggle; union → one tab per variant; array → badge + JSON.
    await expect(form.locator("#action-limit-null")).not_to_be_checked()
    await expect(form.locator("fieldset.union[data-path=shape] .tab")).to_have_text(
        ["Circle", "Square"]
    )
    await expect(form.locator(".field[data-path=grid] .badge")).to_have_text(
        f"array |u1 · (2{TIMES}2)"
    )
    await expect(form.locator("#action-api_key")).to_have_attribute("type", "password")


async def test_form_and_json_editor_stay_in_sync_and_step_sends_it(context, sink):
    ctx, _ = context
    page = await open_ui(ctx, sink.url)
    await page.select_option("#action-colour", label="green")
    await page.check("#action-flag")
    await page.check("#action-mode-1")
    await page.fill("#action-level", "7")
    await page.fill("#action-where\\.x", "4")
    add = page.locator("fieldset.list[data-path=tags] > button")
    await add.click()
    await add.click()
    await page.fill("#action-tags\\.0", "10")
    await page.fill("#action-tags\\.1", "20")
    await page.locator("fieldset.list[data-path=tags] .list-row button").first.click()
    await page.check("#action-limit-null")
    await page.fill("#action-limit", "5")
    await page.click("fieldset.union[data-path=shape] .tab:has-text('Square')")
    await page.fill("#action-shape\\.side", "2.5")
    await page.fill("#action-grid", "[[1, 2], [3, 4]]")
    await page.fill("#action-api_key", "hunter2-secret")
    await page.click("#action .raw-json summary")
    raw = json.loads(await page.input_value("#action-raw"))
    expected = {
        "colour": "green",
        "flag": True,
        "level": 7,
        "ratio": 0.5,
        "name": "",
        "code": "",
        "api_key": "hunter2-secret",
        "mode": "slow",
        "where": {"x": 4, "y": 0},
        "tags": [20],
        "limit": 5,
        "shape": {"kind": "square", "side": 2.5},
        "grid": [[1, 2], [3, 4]],
    }
    assert raw == {**expected, "api_key": MASK}  # secrets are masked wherever shown
    await page.click("#step")
    await expect(page.locator("#timeline li")).to_have_count(2)
    echo = await js(page, "window.corral.episode.steps[1].observation.echo")
    assert echo == {**expected, "grid": {"dtype": "|u1", "shape": [2, 2], "data": "AQIDBA=="}}
    await expect(page.locator("[data-stat=reward] b")).to_have_text("7")
    await expect(page.locator("#detail pre").first).to_contain_text(MASK)
    await expect(page.locator("#detail pre").first).not_to_contain_text("hunter2")
    # Typing JSON updates the form, and what was typed is what is sent (the mask standing
    # for the real secret).
    await page.fill("#action-raw", json.dumps({**raw, "colour": "blue", "level": 11}))
    await expect(page.locator("#action-colour option:checked")).to_have_text("blue")
    sent = await js(page, "window.corral.actionForm.value")
    assert sent["api_key"] == "hunter2-secret" and sent["level"] == 11
    await page.click("#step")
    card = page.locator(".error-card")
    await expect(card).to_have_attribute("data-code", "INVALID_ACTION")
    await expect(page.locator(".field[data-path=level]")).to_have_class("field invalid")
    await screenshot(page, "web-forms")


async def test_an_array_observation_is_drawn_on_a_canvas(context, sink):
    ctx, _ = context
    page = await open_ui(ctx, sink.url)
    canvas = page.locator("#observation tr[data-field=image] canvas")
    await expect(canvas).to_have_attribute("width", "4")
    pixels = await page.eval_on_selector(
        "#observation tr[data-field=image] canvas",
        "c => Array.from(c.getContext('2d').getImageData(0, 0, 4, 4).data)",
    )
    for y in range(4):
        for x in range(4):
            offset = (y * 4 + x) * 4
            assert pixels[offset : offset + 4] == [*IMAGE[y, x].tolist(), 255], (x, y)
    await expect(page.locator("#observation tr[data-field=image] .badge")).to_have_text(
        f"|u1 (4{TIMES}4{TIMES}3)"
    )
    # Long text is preformatted.
    await expect(page.locator("#observation tr[data-field=text] pre")).to_contain_text("line two")


async def test_the_echo_schema_gives_a_message_box(context):
    ctx, _ = context
    with running(EchoEnv, web=True) as srv:
        page = await open_ui(ctx, srv.url)
        await expect(page.locator("#action-message")).to_have_attribute("id", "action-message")
        assert await page.eval_on_selector("#action-message", "el => el.tagName") == "TEXTAREA"
        await page.fill("#action-message", "hello\nthere")
        await page.click("#step")
        await expect(page.locator("#observation tr[data-field=echoed_message] pre")).to_have_text(
            "hello\nthere"
        )


async def test_tools_are_called_on_the_tabs_tool_session(context):
    ctx, _ = context
    with running(CalcEnv, web=True) as srv:
        page = await open_ui(ctx, srv.url)
        card = page.locator("#tools-card")
        await expect(card).to_be_visible()
        names = await page.eval_on_selector_all("#tool-select option", "os => os.map(o => o.text)")
        assert names == ["bump", "divide"]
        await page.select_option("#tool-select", label="divide")
        await page.fill("#tool-a", "6")
        await page.fill("#tool-b", "3")
        await page.click("#tool-call")
        await expect(page.locator("#tool-result .tool-ok")).to_contain_text("2")
        await page.fill("#tool-b", "0")
        await page.click("#tool-call")
        error = page.locator("#tool-result .tool-error")
        await expect(error).to_contain_text("ZeroDivisionError")
        # The tool session keeps its instance between calls.
        await page.select_option("#tool-select", label="bump")
        await page.click("#tool-call")
        await expect(page.locator("#tool-result .tool-ok")).to_contain_text("1")
        await page.click("#tool-call")
        await expect(page.locator("#tool-result .tool-ok")).to_contain_text("2")
        # A missing argument is shown inline too.
        await page.select_option("#tool-select", label="divide")
        await page.click("#tool-call")
        await expect(page.locator("#tool-result .tool-error")).to_be_visible()


class Node(BaseModel):
    label: str = ""
    child: Node | None = None
    children: list[Node] = Field(default_factory=list)


class TreeAction(Action):
    root: Node = Field(default_factory=Node)


class TreeObservation(Observation):
    depth: int = 0
    labels: list[str] = Field(default_factory=list)


class TreeEnv(Environment[TreeAction, TreeObservation, State]):
    """Its action is a tree: a model that contains itself."""

    name = "tree"

    def __init__(self) -> None:
        self._state = State()

    def reset(self, seed: int | None = None, **options: Any) -> TreeObservation:
        return TreeObservation()

    def step(self, action: TreeAction) -> TreeObservation:
        labels: list[str] = []

        def walk(node: Node | None, depth: int) -> int:
            if node is None:
                return depth - 1
            labels.append(node.label)
            return max([walk(node.child, depth + 1)] + [walk(c, depth + 1) for c in node.children])

        return TreeObservation(depth=walk(action.root, 1), labels=labels)

    def state(self) -> State:
        return self._state


async def test_a_model_that_contains_itself_gets_a_finite_form(context):
    ctx, _ = context
    with running(TreeEnv, web=True) as srv:
        page = await open_ui(ctx, srv.url)
        root = page.locator("fieldset[data-path=root]")
        await expect(root.locator("#action-root\\.label")).to_be_visible()
        # Where Node recurs, a JSON editor saying why, not another form without end.
        child = page.locator(".field[data-path='root.child']")
        await expect(child.locator(".badge")).to_have_text("JSON: Node contains itself")
        await page.fill("#action-root\\.label", "a")
        await page.check("#action-root\\.child-null")
        await page.fill("#action-root\\.child", '{"label": "b", "child": {"label": "c"}}')
        await page.click("#step")
        await expect(page.locator("#timeline li")).to_have_count(2)
        assert await js(page, "window.corral.episode.steps[1].observation.labels") == [
            "a",
            "b",
            "c",
        ]
        assert await js(page, "window.corral.episode.steps[1].observation.depth") == 3
