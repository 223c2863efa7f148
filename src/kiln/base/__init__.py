"""The foundation every layer stands on: nothing here imports another part of kiln.

errors.py           every exception kiln shows a user, and the exit status of each
terminal.py         what reaches a terminal: escaped, never raw control sequences
redact.py           the secrets URLs carry, hidden wherever a URL is shown or kept
events.py           the build's event vocabulary (``BuildEvent``) and its readers
action_env.py       the environment of the programs kiln runs for actions
compile_targets.py  the ``--target`` values and the iree-compile flags of each
cpus.py             how many CPUs this process may use (the default ``-j``)
reached.py          what a run of an action's code reached (modules, files read)
modnames.py         the import names of build modules loaded by path
iree_shim.py        ``import iree.build`` resolved to kiln while a build runs
gc_pause.py         the cyclic collector paused around graph construction
bytecode.py         no ``__pycache__`` beside the user's sources while their code runs
"""
