"""The contract layer: what an environment author writes, and what crosses the wire.

The names here are the ones users need: the three models and the step result, the
:class:`Environment` base class, :class:`WireModel` (the base of nested models that
cross the wire) and the error a model that cannot cross it raises. The machinery has
its own modules: :mod:`~corral.contract.schema` (contracts, schemas, fingerprints,
versions), :mod:`~corral.contract.dynamic` (models built from schemas),
:mod:`~corral.contract.wiresafe` (the wire-safety check), :mod:`~corral.contract.arrays`
(numpy array fields), :mod:`~corral.contract.lock`, :mod:`~corral.contract.options`,
:mod:`~corral.contract.snapshot` (the optional typed snapshot of an environment's state)
and :mod:`~corral.contract.tools`.
"""

from corral.contract.environment import Environment
from corral.contract.models import Action, Observation, State, StepResult, WireModel
from corral.contract.snapshot import Snapshot
from corral.contract.wiresafe import WireSafetyError

__all__ = [
    "Action",
    "Environment",
    "Observation",
    "Snapshot",
    "State",
    "StepResult",
    "WireModel",
    "WireSafetyError",
]
