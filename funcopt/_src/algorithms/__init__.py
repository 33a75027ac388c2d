"""algorithms: one module per optimizer, holding its state, its math and its pure factory.
They import `core` and `engine`, never the torch face."""
