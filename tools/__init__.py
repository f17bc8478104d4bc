"""Repository tools (not shipped in any distribution): ``python -m tools.bench.<name>`` runs a benchmark."""
