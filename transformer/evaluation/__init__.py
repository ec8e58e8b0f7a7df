"""Scoring, translating, averaging and exporting trained runs."""
