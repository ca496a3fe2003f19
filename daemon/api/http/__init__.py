"""The HTTP house: middleware (access log, guard, limits), error bodies, the worker pool, the stream wire
formats and the /api/events route. Imports no dialect and no pipeline step."""
