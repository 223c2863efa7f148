"""The parts of running one plan, each behind a narrow interface; the loop that
ties them is ``kiln.engine.scheduler.Scheduler`` (as Ninja's ``Builder::Build`` ties
its ``Plan`` and ``CommandRunner``).

    ready.py         ``ReadyQueue``: what may start; the failure cascade; which
                     waiting action starts first (critical path)
    shared.py        ``Shared``: what the scheduler and the dispatch share (the
                     completions inbox, the run records, the events, stopping)
    runner.py        ``Runner``: the protocol of one place an action's work runs
                     (``takes``, ``placement``, ``start``, ``cancel``, ``shutdown``)
    runners.py       the build's runners: the cache, the cluster, a worker process,
                     in-line, a worker thread
    dispatch.py      ``Dispatcher``: gives a started action to the first runner that
                     takes it, in-line or on a worker thread
    command_lanes.py ``CommandLanes``: the runner of commands started without a
                     thread, each in a lane, finished when the build's command
                     runner reaps them
    recording.py     ``Recorder``: the records of finished actions and their
                     failures, written in groups (one transaction per round)
    failures.py      which failures are remembered (``judge``): only one kiln can
                     put down to the key; an action that failed so is not run
                     again with the same key
    failure_signs.py the surroundings' signs in an error or a log's bounded tail
    interruption.py  stopping a build: what runs is killed, what it half-wrote removed
"""
