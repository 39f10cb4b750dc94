"""Capacity and cost model of Punctual at AWS scale (docs/capacity.md explains every input).

A discrete-event simulation of the top of the hour (EventBridge ticks, the Step Functions Map
over shard groups, materializer invocations with their timeout, leases, retries and the
shards each walks in turn, transactions of 49 schedule steps) followed by the stream and the
relay as a queue, with the per-operation costs measured locally (``make bench``,
``make bench-materializer``) and AWS latencies that are stated assumptions. It prints
schedule_lag p50/p95/p99 for strict and flexible occurrences, the busiest partitions, the
bottleneck, the smallest shard count N and lookahead L that keep strict p99 <= 1 s with one
shard group failed and retried, a cross-check against the local ``make bench`` run, and the
cost per million occurrences (scheduler path and worker SDK apart) before and after each cut
of the write path. Run: ``make capacity`` (options: ``--help``; stdlib only).
"""
