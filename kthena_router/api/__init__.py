"""Kthena's API kinds as typed declarations: the source of configs/crds/*.yaml, of the router's
file-mode field rules and of the controller's model (docs/crds.md).

Importable without the router's runtime: it depends on nothing but the standard library.
"""
