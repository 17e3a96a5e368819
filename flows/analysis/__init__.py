"""The cost-accuracy frontier's analysis, apart from the command that runs it (flows/frontier.py): records
(reading runs), frontier (labels, grouping, the Pareto set, paired steps: pure functions), render (markdown, HTML)
and figures (matplotlib)."""
