"""Engine state for scheduling: scraped /metrics and /v1/models per endpoint, plus the
router's own observed load, fed to the scheduler."""

from .metrics_parse import LoraInfo, ParsedMetrics, normalize_flavour, parse_metrics
from .scraper import EngineStateScraper, ObservedLoad, ScrapeTarget
from .snapshot import EndpointSnapshot, ModelsInfo, SnapshotTracker, parse_models

__all__ = [
    "EndpointSnapshot",
    "EngineStateScraper",
    "LoraInfo",
    "ModelsInfo",
    "ObservedLoad",
    "ParsedMetrics",
    "ScrapeTarget",
    "SnapshotTracker",
    "normalize_flavour",
    "parse_metrics",
    "parse_models",
]
