"""Comparing two builds (``kiln compare``): what changed between them, why, and whether it
got faster, slower or less accurate.

- ``history``: the manifests of earlier builds, kept in ``.kiln/manifests/``;
- ``builds``: a build named by its output directory, manifest or ``@-N``, read as untrusted;
- ``diff``: the rows (added, removed, renamed, unchanged, changed; per module its deltas),
  the pools of samples by (digest, device);
- ``outputs``: the largest difference between two builds' outputs on the same inputs;
- ``stats``: the latency statistic; ``measure``: ``--measure``'s interleaved runs;
- ``gate``: ``--fail-if``; ``table``: the terminal table and ``--json``; ``page``: ``--html``.
"""
