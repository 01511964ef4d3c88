"""Capture: classifying a date's changes against the previous state, planning dates, guarding and reconciling them."""
