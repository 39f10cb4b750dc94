"""Local (embedded) mode: AWS's own engines on loopback, for development and benchmarks."""
