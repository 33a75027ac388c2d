"""engine: an algorithm's spec (`algorithm.Algorithm`), the ops its math is written against
(`ops`), which leaves of a functional update step together (`groups`), and the planner and
executors that run that math on lists of tensors (`inplace`). It imports only `core`."""
