"""kiln's version, in its own module so that the core reads it without importing
the package's public facade. The digest of kiln's code, which keys kiln's own
actions beside it, is ``kiln.planning.code_key.kiln_code_digest``."""

__version__ = "0.1.0"
