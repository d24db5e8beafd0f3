"""A corral environment with tools, served in a child process for the MCP compat tests."""

from __future__ import annotations

from typing import Any

from corral.contract import Action, Environment, Observation, State
from corral.contract.tools import tool


class NoteAction(Action):
    text: str


class NoteObservation(Observation):
    count: int = 0


class NotesEnv(Environment[NoteAction, NoteObservation, State]):
    """Keeps notes; tools read and search them."""

    name = "notes"
    description = "Keeps notes; tools count and search them."

    def __init__(self) -> None:
        self.notes: list[str] = []

    def reset(self, seed: int | None = None, **options: Any) -> NoteObservation:
        self.notes = []
        return NoteObservation()

    def step(self, action: NoteAction) -> NoteObservation:
        self.notes.append(action.text)
        return NoteObservation(count=len(self.notes), reward=1.0)

    def state(self) -> State:
        return State(step_count=len(self.notes))

    @tool
    def search(self, word: str, limit: int = 10) -> list[str]:
        """The notes containing ``word``."""
        return [note for note in self.notes if word in note][:limit]

    @tool
    def count(self) -> int:
        """How many notes there are."""
        return len(self.notes)
