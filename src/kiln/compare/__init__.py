"""Comparing two builds (``kiln compare``): what changed between them, why, and whether it
got faster, slower or less accurate.

- ``builds``: a build named by its output directory, manifest or ``@-N`` (the manifests of
  earlier builds, which the manifest's writer keeps: ``kiln.observe.manifest_history``),
  read as untrusted;
- ``diff``: the rows (added, removed, renamed, unchanged, changed; per module its deltas),
  the pools of samples by (digest, device);
- ``outputs``: the largest difference between two builds' outputs on the same inputs;
- ``stats``: the latency statistic; ``measure``: ``--measure``'s interleaved runs;
- ``gate``: ``--fail-if``; ``table``: the terminal table and ``--json``; ``page``: ``--html``.
"""
