"""A korrel scenario (a third-party OpenEnv environment generator from PyPI): one turn,
no model call (a persona is never invoked at ``max_turns=1``), a rubric as the reward."""

from korrel.persona import Persona
from korrel.rubric import Rubric
from korrel.scenario import Scenario


def mentions_refund(completion, info):
    """1 when the assistant's reply mentions a refund."""
    text = " ".join(str(m.content or "") for m in completion if m.role == "assistant")
    return 1.0 if "refund" in text.lower() else 0.0


scenario = Scenario(
    id="refund-desk",
    system="You are a support agent.",
    persona=Persona(goal="get a refund"),
    opening_message="My order arrived broken.",
    max_turns=1,
    rubric=Rubric([mentions_refund]),
)
