"""The one place TokenSpeed's scheduler is imported (tokenspeed-scheduler 0.1.42, pinned in
requirements.txt): the adapter reads this namespace, and the forkserver preloads it."""

import tokenspeed_scheduler as ts

AttnKind = ts.AttnKind
CacheGroupConfig = ts.CacheGroupConfig
SchedulerConfig = ts.SchedulerConfig
Scheduler = ts.Scheduler
RequestSpec = ts.RequestSpec
ExecutionEvent = ts.ExecutionEvent
ForwardEvent = ts.ForwardEvent
Cache = ts.Cache
