"""Plans and keys: what a build needs, in what order, and what each action's key is.

    plan.py        ``Plan``: the nodes the requested targets need, each action's inputs
                   and outputs, in dependency order (O(nodes + edges))
    action_key.py  ``KeyMaker``: the keyed parameters of every action of a plan
    canonical.py   canonical forms of the values that go into a key
    code_key.py    the digest of the code an action runs
    run_deps.py    run-time dependencies: recorded after a run, checked on the next
    sandbox.py     where an action's files lie when it runs away from the output
                   directory (a Dask worker, ``--check-reproducible``)

Nothing here runs an action or touches the output directory: a plan and its keys
are values, made before anything is written.
"""
