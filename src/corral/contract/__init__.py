"""The contract layer: models, wire safety, schemas, fingerprints and versions."""

from corral.contract.dynamic import contract_models, model_from_schema
from corral.contract.environment import Environment
from corral.contract.models import Action, Observation, State, StepResult, WireModel
from corral.contract.schema import Contract, compatible, fingerprint, model_schemas, parse_semver
from corral.contract.wiresafe import WireProblem, WireSafetyError, check_model, make_wire_safe

__all__ = [
    "Action",
    "Contract",
    "Environment",
    "Observation",
    "State",
    "StepResult",
    "WireModel",
    "WireProblem",
    "WireSafetyError",
    "check_model",
    "compatible",
    "contract_models",
    "fingerprint",
    "make_wire_safe",
    "model_from_schema",
    "model_schemas",
    "parse_semver",
]
