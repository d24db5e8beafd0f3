"""RBAC for the emulated API server: who may call what, as a real API server decides it.

kmock answers every request. To test that corral's calls fit the Roles it documents
(:mod:`corral.providers.kubernetes.rbac`), the emulator (``tests/support/kube.py``) asks
an :class:`Authorizer` about every request that carries a bearer token:

* the token names a subject (``register``: a user such as a trainer, or a service
  account whose token the fake kubelet mounts into a Pod);
* the subject's rules are those of the Roles the namespace's RoleBindings bind to it,
  read from the emulator's own stored objects (so a test applies a rendered Role and
  RoleBinding through the API, as an operator would);
* the request's verb is derived as the API server does (GET of a collection is
  ``list``, with ``watch=true`` ``watch``; GET of an object ``get``; POST ``create``;
  PATCH ``patch``; DELETE ``delete``; a WebSocket upgrade of ``pods/portforward``
  ``create``, as API servers with AuthorizePodWebsocketUpgradeCreatePermission do);
* a rule matches on API group, resource (``pods/log`` for a subresource), verb and
  ``resourceNames``; ``*`` matches anything.

Anything not granted gets the API server's 403 ``Forbidden`` Status. Every decision is
recorded (:attr:`Authorizer.calls`), so a test can show what a code path needed.
Requests without a token are the test harness's own (its kubelet, controllers and
set-up): they are not checked, as a cluster admin's would not be.

Not modelled: ClusterRoles and ClusterRoleBindings, aggregation, groups, impersonation,
non-resource URLs beyond discovery (always allowed to a known subject), and
``resourceNames`` with list/watch field selectors.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

ROLES = "rbac.authorization.k8s.io/v1/roles"
ROLE_BINDINGS = "rbac.authorization.k8s.io/v1/rolebindings"
RBAC_RESOURCES = (ROLES, ROLE_BINDINGS)


@dataclass(frozen=True)
class Attributes:
    """What a request asks for, as the API server's authorizer sees it."""

    verb: str
    group: str
    resource: str
    namespace: str
    name: str

    def describe(self) -> str:
        return f"{self.verb} {self.group or 'core'}/{self.resource} {self.name}".rstrip()


@dataclass(frozen=True)
class Call:
    """One authorised (or refused) request."""

    subject: str
    attributes: Attributes
    allowed: bool


def attributes(
    method: str, path: str, query: Mapping[str, str], upgrade: bool
) -> Attributes | None:
    """The request's attributes, or None for a non-resource path (discovery)."""
    parts = path.strip("/").split("/")
    if parts[:1] == ["api"] and len(parts) >= 2:
        group, rest = "", parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 3:
        group, rest = parts[1], parts[3:]
    else:
        return None
    if len(rest) < 3 or rest[0] != "namespaces":
        # Discovery (/api/v1) and cluster-scoped paths: none of corral's calls.
        return None if not rest else Attributes(method.lower(), group, rest[0], "", "")
    namespace, resource = rest[1], rest[2]
    name = rest[3] if len(rest) > 3 else ""
    if len(rest) > 4:
        resource = f"{resource}/{rest[4]}"
    if method == "GET":
        if upgrade and resource.endswith(("/portforward", "/exec", "/attach")):
            verb = "create"
        elif name:
            verb = "get"
        else:
            verb = "watch" if query.get("watch") in ("true", "1") else "list"
    else:
        verb = {
            "POST": "create",
            "PUT": "update",
            "PATCH": "patch",
            "DELETE": "delete" if name else "deletecollection",
        }.get(method, method.lower())
    return Attributes(verb, group, resource, namespace, name)


def _matches(rule: Mapping[str, Any], wanted: Attributes) -> bool:
    def has(key: str, value: str) -> bool:
        values = rule.get(key) or []
        return "*" in values or value in values

    resource_ok = has("resources", wanted.resource) or (
        "/" in wanted.resource
        and f"{wanted.resource.split('/')[0]}/*" in (rule.get("resources") or [])
    )
    names = rule.get("resourceNames") or []
    return (
        has("apiGroups", wanted.group)
        and resource_ok
        and has("verbs", wanted.verb)
        and (not names or wanted.name in names)
    )


@dataclass
class Authorizer:
    """Bearer tokens to subjects, and RBAC over the emulator's Roles (module docstring).

    Attributes:
        calls: every checked request, in order.
    """

    tokens: dict[str, tuple[str, str, str]] = field(default_factory=dict)
    calls: list[Call] = field(default_factory=list)

    def register(self, token: str, kind: str, name: str, namespace: str = "") -> None:
        """Make ``token`` authenticate ``kind`` (``User`` or ``ServiceAccount``) ``name``."""
        self.tokens[token] = (kind, name, namespace)

    def subject(self, token: str) -> tuple[str, str, str] | None:
        return self.tokens.get(token)

    @staticmethod
    def describe(subject: tuple[str, str, str]) -> str:
        kind, name, namespace = subject
        if kind == "ServiceAccount":
            return f"system:serviceaccount:{namespace}:{name}"
        return name

    def rules(
        self,
        objects: Iterator[tuple[str, str, dict[str, Any]]],
        subject: tuple[str, str, str],
        namespace: str,
    ) -> list[Mapping[str, Any]]:
        """The rules of every Role of ``namespace`` bound to ``subject``.

        ``objects``: ``(resource, namespace, object)`` of every stored object.
        """
        roles: dict[str, dict[str, Any]] = {}
        bindings: list[dict[str, Any]] = []
        for resource, where, obj in objects:
            if where != namespace:
                continue
            if resource == ROLES:
                roles[obj["metadata"]["name"]] = obj
            elif resource == ROLE_BINDINGS:
                bindings.append(obj)
        kind, name, own_namespace = subject
        found: list[Mapping[str, Any]] = []
        for binding in bindings:
            for s in binding.get("subjects") or []:
                same = s.get("kind") == kind and s.get("name") == name
                if kind == "ServiceAccount":
                    same = same and (s.get("namespace") or namespace) == own_namespace
                if same and binding["roleRef"].get("kind") == "Role":
                    role = roles.get(binding["roleRef"]["name"])
                    found += (role or {}).get("rules") or []
        return found

    def decide(
        self,
        objects: Iterator[tuple[str, str, dict[str, Any]]],
        subject: tuple[str, str, str],
        wanted: Attributes,
    ) -> bool:
        """Whether ``subject`` may do ``wanted`` (recorded in :attr:`calls`)."""
        allowed = any(
            _matches(rule, wanted) for rule in self.rules(objects, subject, wanted.namespace)
        )
        self.calls.append(Call(self.describe(subject), wanted, allowed))
        return allowed

    def refused(self) -> list[Call]:
        """The calls that were refused."""
        return [c for c in self.calls if not c.allowed]

    def needed(self, subject: str) -> set[tuple[str, str, str]]:
        """``(group, resource, verb)`` of every call ``subject`` made."""
        return {
            (c.attributes.group, c.attributes.resource, c.attributes.verb)
            for c in self.calls
            if c.subject == subject
        }


def forbidden(subject: str, wanted: Attributes) -> dict[str, Any]:
    """The API server's Status for a refused request."""
    group = f' in API group "{wanted.group}"' if wanted.group else ' in API group ""'
    where = f' in the namespace "{wanted.namespace}"' if wanted.namespace else ""
    what = wanted.resource.split("/")[0]
    name = f' "{wanted.name}"' if wanted.name else ""
    sub = f"/{wanted.resource.split('/')[1]}" if "/" in wanted.resource else ""
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": f'{what}{sub}{name} is forbidden: User "{subject}" cannot {wanted.verb} '
        f'resource "{wanted.resource}"{group}{where}',
        "reason": "Forbidden",
        "details": {"name": wanted.name, "kind": what},
        "code": 403,
    }
