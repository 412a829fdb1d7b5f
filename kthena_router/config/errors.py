"""ConfigError: every problem of a config source, each naming file, document and field."""

from __future__ import annotations

from dataclasses import dataclass


# ConfigProblem.reason values (Kubernetes mode turns them into status conditions).
BACKEND_NOT_FOUND = "BackendNotFound"  # a route target names no ModelServer / ExternalModelProvider
# Kthena's ExternalModelProvider reasons (pkg/apis/networking/v1alpha1).
CREDENTIAL_NOT_FOUND = "CredentialNotFound"
CREDENTIAL_KEY_NOT_FOUND = "CredentialKeyNotFound"
CREDENTIAL_INVALID = "CredentialInvalid"


@dataclass(frozen=True, slots=True)
class ConfigProblem:
    file: str
    document: str  # e.g. "document 2 (ModelRoute default/demo)"; "" when not known
    field: str  # e.g. "spec.rules[0].targetModels[1].weight"; "" for the whole document
    message: str
    # CamelCase cause for Kubernetes status conditions (e.g. "BackendNotFound",
    # "CredentialNotFound"); "" = the object is invalid as written. Not part of the text.
    reason: str = ""

    def __str__(self) -> str:
        parts = [self.file]
        if self.document:
            parts.append(self.document)
        if self.field:
            parts.append(self.field)
        return ": ".join(parts) + ": " + self.message


class ConfigError(Exception):
    """An invalid config source. ``problems`` holds all of them; the attributes
    ``file``/``document``/``field``/``message`` are those of the first one."""

    def __init__(self, problems: list[ConfigProblem]):
        if not problems:
            raise ValueError("ConfigError needs at least one problem")
        self.problems: tuple[ConfigProblem, ...] = tuple(problems)
        first = self.problems[0]
        self.file = first.file
        self.document = first.document
        self.field = first.field
        self.message = first.message
        super().__init__(str(self))

    def __str__(self) -> str:
        return "\n".join(str(p) for p in self.problems)
