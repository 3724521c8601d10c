"""Benchmarks for raygate (`make bench`): tables on stdout, JSON under build/bench/."""
