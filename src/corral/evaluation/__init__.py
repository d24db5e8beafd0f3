"""Evaluation: run a policy over many episodes of an environment, recorded and resumable.

    summary = await evaluate("corral.envs.wordle:WordleEnv", policy="scripted",
                             split="test", concurrency=16, out="runs/wordle-scripted")
    summary.success_rate, summary.mean_return, summary.components, summary.errors

``corral eval`` is its command line. :mod:`~corral.evaluation.runner` plays the episodes
through an ``EnvPool``; :mod:`~corral.evaluation.policies` and
:mod:`~corral.evaluation.llm` pick the actions; :mod:`~corral.evaluation.report`
summarizes the episode file.
"""

from corral.evaluation.llm import LLMAgent, LLMClient, llm_policy
from corral.evaluation.policies import Agent, Policy, PolicyError, SchemaSampler, load_policy
from corral.evaluation.report import EvalSummary, Throughput, summarize, summary_table
from corral.evaluation.rundir import EvalError, RunSettings
from corral.evaluation.runner import evaluate

__all__ = [
    "Agent",
    "EvalError",
    "EvalSummary",
    "LLMAgent",
    "LLMClient",
    "Policy",
    "PolicyError",
    "RunSettings",
    "SchemaSampler",
    "Throughput",
    "evaluate",
    "llm_policy",
    "load_policy",
    "summarize",
    "summary_table",
]
