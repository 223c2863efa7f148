"""Running one plan: the loop (``scheduler.py``, as Ninja's ``Builder::Build``) and
its parts, each behind a narrow interface.

    scheduler.py       ``Scheduler``: the loop that ties the parts below
    result.py          what a build is asked (``SchedulerOptions``) and what came of
                       it (``BuildResult``, each node's ``NodeRun``)
    ready.py           ``ReadyQueue``: what may start; the failure cascade; which
                       waiting action starts first (``priority.py``: critical path)
    incremental.py     ``UpToDateChecker``: an action's key, and whether (and why) it
                       runs
    dispatch.py        ``Dispatcher``: where a started action runs (in-line, a worker
                       thread, the process pool, a command, the cluster) or is served
                       from the cache (``cache_step.py``: what is shared)
    command_lanes.py   ``CommandLanes``: commands started without a thread each
    limits.py          ``-j``, the named pools, which actions run in-line
    shared.py          ``Shared``: what the loop and the dispatch share
    inbox.py           the loop's inbox: what finished, from any thread
    action_outputs.py  an action's outputs made ready, hashed, removed
    recording.py       ``Recorder``: records and failures, one transaction per round
    failures.py        which failures are remembered (``judge``); their signs in
                       ``failure_signs.py``
    interruption.py    stopping a build: what runs is killed, its half-writes removed
    build_events.py    the one place that turns what the loop does into events
    reproducible.py    ``--check-reproducible``: every action again, compared
    unrequested.py     what became of the actions a build did not plan
"""
