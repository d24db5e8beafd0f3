"""Episodes as data: the one file format for recorded episodes (trajectories).

The client and the pool record into it (``record="dir/"``), the web UI exports and
imports it, ``corral eval`` writes it and ``corral replay`` reads it. A file is JSON
Lines, one line per request::

    {"kind":"header","format":"corral-episodes/1","env":{"name":"wordle","fingerprint":...},...}
    {"kind":"step","episode":"a1","session":"s1","index":0,"op":"reset","seed":7,"observation":{...},...}
    {"kind":"step","episode":"a1","session":"s1","index":1,"op":"step","action":{"guess":"crane"},...}
    {"kind":"end","episode":"a1","outcome":"terminated","length":4,"total_reward":1.35,...}

Reading::

    from corral import episodes
    for episode in episodes.read("runs/a/episodes.jsonl"):
        episode.seed, episode.actions, episode.summary.total_reward

Writing::

    with episodes.EpisodeWriter(path, episodes.Header(env=...)) as out:
        recorder = episodes.EpisodeRecorder(out)
        recorder.reset("s1", seed=7, observation=first, t=time.time())
        recorder.step("s1", action=action, observation=obs, t=..., latency_s=...)

:mod:`corral.episodes.format` defines the lines, :mod:`~corral.episodes.episode` puts
them back together, :mod:`~corral.episodes.files` reads and writes files,
:mod:`~corral.episodes.recorder` turns live results into lines and
:mod:`~corral.episodes.compare` finds where two episodes part. This package is the
format's only home (the issue's ``corral.trajectories.read`` is ``corral.episodes.read``).
"""

from corral.contract.tasks import TaskRef
from corral.episodes.compare import Divergence, compare, compare_records, first_difference
from corral.episodes.episode import (
    Episode,
    EpisodeFormatError,
    Tally,
    assemble,
    collect,
    success_of,
)
from corral.episodes.files import EpisodeWriter, iter_episodes, iter_lines, read
from corral.episodes.format import (
    FORMAT,
    FORMAT_VERSION,
    LINE,
    SESSION_ENDING_CODES,
    EnvInfo,
    EpisodeEnd,
    ErrorInfo,
    Header,
    Line,
    Lineage,
    Outcome,
    StepRecord,
    dump_line,
    line_schema,
)
from corral.episodes.recorder import EpisodeRecorder

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "LINE",
    "SESSION_ENDING_CODES",
    "Divergence",
    "EnvInfo",
    "Episode",
    "EpisodeEnd",
    "EpisodeFormatError",
    "EpisodeRecorder",
    "EpisodeWriter",
    "ErrorInfo",
    "Header",
    "Line",
    "Lineage",
    "Outcome",
    "StepRecord",
    "Tally",
    "TaskRef",
    "assemble",
    "collect",
    "compare",
    "compare_records",
    "dump_line",
    "first_difference",
    "iter_episodes",
    "iter_lines",
    "line_schema",
    "read",
    "success_of",
]
