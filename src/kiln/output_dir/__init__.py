"""The output directory: whose it is, and how kiln writes, reads and removes there.

    ownership.py  whose a directory is (``claim_output_dir``), kiln's own files,
                  reading outputs (``open_regular``)
    writing.py    temporaries, commits by rename, ``sync_filesystem``, removal
    tree.py       ``OutputTree``: directories made one checked component at a time
    names.py      output names checked when the graph is defined
    prefilled.py  the user's files in a prefilled output directory
    layout.py     where each namespace, log and kiln's own file lives
    lock.py       one build at a time per output directory (``.kiln/lock``)
    digests.py    SHA-256 of files and streams, a chunk at a time
    tree_digest.py  the digest of a directory an action reads

Every file kiln writes goes through this module, so the trust model holds by
construction rather than writer by writer:

- **Ownership.** kiln uses an output directory only when it is new, empty,
  holding only its namespace folders with a user's files (``prefilled``:
  those stay the user's), or marked as kiln's by ``.kiln/format``
  (``kiln-output/1``). ``claim_output_dir`` is the one function that creates
  ``.kiln/``; everything else finds it there.
- **Confinement.** Below the output root kiln never writes through a symbolic
  link: directories are made component by component with ``lstat`` checks
  (``OutputTree``), kiln's own files are opened with ``O_NOFOLLOW``, temporaries
  with ``O_EXCL``, and outputs are committed by ``rename``, which replaces a
  link instead of following it.
- **Regular files only.** Outputs are read with ``O_NOFOLLOW | O_NONBLOCK`` and
  an ``fstat`` check (``open_regular``): a symlink, FIFO, socket, device or
  directory is never read and never blocks.

Temporaries: one scheme, ``.kiln-tmp-<10 hex of the name's digest>-<8 random
hex><extension>`` beside the file they become, at most 45 bytes whatever the
output's name, so a name of NAME_MAX bytes still has a temporary. A command's
temporary (its ``{out}``) has eight zeros for the random part: always the same
name, so that a command that writes its own output path writes the same bytes.

Durability: a temporary becomes the output by rename, so a killed build never
leaves a half-written file under an output's name. What reaches the disk is
settled once per build, not per file: ``sync_filesystem`` before the build says
it is done (one ``syncfs``, a few milliseconds after thousands of outputs, where
an ``fsync`` per output cost each command a disk wait). A power cut in the middle
of a build can leave an output shorter than what was recorded; the state's stat
key (size, mtime, inode, ctime) then differs, and the next build reruns it.
"""
