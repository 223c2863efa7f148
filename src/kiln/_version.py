"""kiln's version, in its own module so that the core reads it without importing
the package's public facade."""

__version__ = "0.1.0"
