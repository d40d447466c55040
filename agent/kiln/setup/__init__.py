"""A serving setup as values: the plan's types, what it holds in memory, and its start-up's parts. The planner and
the performance engine both build on it."""
