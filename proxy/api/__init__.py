"""The management API, /api/v1: JSON, seed 004's shapes and statuses to the letter."""
