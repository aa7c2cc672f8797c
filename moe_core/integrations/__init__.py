"""Bridges from model libraries to moe-core layers; each module imports its library only when called."""
