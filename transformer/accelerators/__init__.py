"""What a run's programs cost on accelerators: AOT compilation, HLO reading, roofline, chips, speed."""
