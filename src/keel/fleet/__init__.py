"""Fleet mode: run journals in JetStream, a work queue of runs, workers (docs/fleet.md)."""
