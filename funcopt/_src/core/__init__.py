"""core: pytrees, the base types (`GradientTransformation`, `MaskedNode`), tracing helpers,
and the plumbing that lets any hyperparameter be a schedule. It imports nothing of funcopt's."""
