"""The engine: run schedules."""
