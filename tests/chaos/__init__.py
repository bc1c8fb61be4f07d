"""Seeded chaos trials around the real `supervise` (docs/chaos.md)."""
