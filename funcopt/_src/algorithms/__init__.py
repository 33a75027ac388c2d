"""algorithms: the engine `Algorithm`s, each with its state, its math and its pure factory.
Most modules hold one optimizer; ``catalogue_more.py`` holds eight of the catalogue's and
``lamb_adan.py`` four; L-BFGS (no `Algorithm`) spans ``lbfgs.py``, ``lbfgs_loop.py`` and
``lbfgs_search.py``. They import `core` and `engine`, never the transforms or the torch
face."""
