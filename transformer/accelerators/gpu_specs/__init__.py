"""XLA GPU target descriptions (text protos from XLA's source tree) that topologies.py compiles for."""
