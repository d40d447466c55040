"""The planner: machine + profile + choice -> a plan, or a refusal that says what would fit."""
