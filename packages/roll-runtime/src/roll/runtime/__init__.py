"""roll.runtime."""
