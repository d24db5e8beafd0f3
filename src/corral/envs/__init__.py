"""Built-in example environments."""
