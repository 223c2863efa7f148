"""kiln's built-in actions, one module per family."""
