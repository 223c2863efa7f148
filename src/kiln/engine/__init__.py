"""Running one plan: the loop (``scheduler.py``, as Ninja's ``Builder::Build``) and
its parts, each behind a narrow interface.

    scheduler.py       ``Scheduler``: the loop that ties the parts below
    request.py         ``BuildRequest``: the front door, one frozen value of what a
                       build is asked (its ``SchedulerOptions`` and the rest)
    result.py          what came of a build (``BuildResult``, each node's ``NodeRun``)
    ready.py           ``ReadyQueue``: what may start; the failure cascade; which
                       waiting action starts first (``priority.py``: critical path)
    incremental.py     ``UpToDateChecker``: an action's key, and whether (and why) it
                       runs
    runner.py          ``Runner``: the protocol of one place an action's work runs
                       (``takes``, ``placement``, ``start``, ``cancel``, ``shutdown``)
    runners.py         the build's runners, in order: the cache (``cache_step.py``:
                       what is shared), the cluster, a worker process, in-line, a
                       worker thread
    dispatch.py        ``Dispatcher``: gives a started action to the first runner
                       that takes it, in-line or on a worker thread
    command_lanes.py   ``CommandLanes``: the runner of commands started without a
                       thread each
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
