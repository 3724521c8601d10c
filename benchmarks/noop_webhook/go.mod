module raygate.io/benchmarks/noop-webhook

go 1.26
