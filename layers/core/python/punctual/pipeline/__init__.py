"""The scheduler's path, each an orchestrator a Lambda runs: the materializer (schedules
to occurrences), the relay (occurrences to queues) and its redrive, the reconciler (proves
nothing was missed), rezone (re-plans after tzdata changes) and fail-over."""
