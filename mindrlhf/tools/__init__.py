"""Tools for multi-turn episodes: tool schemas from plain functions (more to come)."""
