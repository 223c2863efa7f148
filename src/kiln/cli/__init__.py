"""kiln's command line: one module per command; ``main`` dispatches."""
