"""Comparing two builds: what changed between them, and whether it got faster or slower."""
