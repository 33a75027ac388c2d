"""engine: an algorithm's spec (`algorithm.Algorithm`), the ops its math is written against
(`ops`), and the planner and executors that run that math on lists of tensors (`inplace`).
It imports only `core`."""
