"""Punctual: a multi-tenant job scheduler. Domain package shared by every Lambda."""
