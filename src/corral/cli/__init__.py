"""The ``corral`` command line."""
