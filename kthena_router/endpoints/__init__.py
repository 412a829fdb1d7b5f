"""Endpoints of ModelServers: resolution, health, choice."""
