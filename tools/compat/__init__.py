"""Compatibility measurements (ROLL's example configs through roll's ROLL-config loader)."""
