"""Router configuration: typed model, YAML loader, file watcher."""

from .errors import ConfigError, ConfigProblem
from .loader import load_config_bytes, load_config_file
from .model import (
    Endpoint,
    EndpointSet,
    ModelRoute,
    ModelServer,
    PDGroup,
    RateLimit,
    RouteRule,
    RouterConfig,
    StringMatch,
    TargetModel,
)

__all__ = [
    "ConfigError",
    "ConfigProblem",
    "Endpoint",
    "EndpointSet",
    "ModelRoute",
    "ModelServer",
    "PDGroup",
    "RateLimit",
    "RouteRule",
    "RouterConfig",
    "StringMatch",
    "TargetModel",
    "load_config_bytes",
    "load_config_file",
]
