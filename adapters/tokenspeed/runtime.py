"""The one place TokenSpeed's scheduler is imported (tokenspeed-scheduler 0.1.42, pinned in
requirements.txt): the adapter reads this namespace, and the forkserver preloads it."""

import os

# TokenSpeed logs each retraction, restore and capacity abort at info/warn level on stdout
# (spdlog; it reads SPDLOG_LEVEL when a scheduler is built). The adapter reports each of
# them as a preemption of the plan, so by default only errors are printed.
os.environ.setdefault("SPDLOG_LEVEL", "error")

import tokenspeed_scheduler as ts

AttnKind = ts.AttnKind
CacheGroupConfig = ts.CacheGroupConfig
SchedulerConfig = ts.SchedulerConfig
Scheduler = ts.Scheduler
RequestSpec = ts.RequestSpec
ExecutionEvent = ts.ExecutionEvent
ForwardEvent = ts.ForwardEvent
Cache = ts.Cache
