"""Figures: training curves, bars with error bars, attention maps."""
