"""The ModelBooster controller: one ModelBooster -> a ModelServing, a ModelServer, a ModelRoute
(and an AutoscalingPolicy when asked), as Kthena's model-booster-controller (docs/booster.md)."""
