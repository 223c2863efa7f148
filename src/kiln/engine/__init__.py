"""The parts of running one plan, each behind a narrow interface; the loop that
ties them is ``kiln.engine.scheduler.Scheduler`` (as Ninja's ``Builder::Build`` ties
its ``Plan`` and ``CommandRunner``).

    ready.py         ``ReadyQueue``: what may start; the failure cascade; which
                     waiting action starts first (critical path)
    shared.py        ``Shared``: what the scheduler and the dispatch share (the
                     completions inbox, the run records, the events, stopping)
    dispatch.py      ``Dispatcher``: where a started action runs (in-line, a worker
                     thread, the process pool, the cluster) or is served from
                     the cache
    command_lanes.py ``CommandLanes``: commands started without a thread, each in a
                     lane, finished when the build's command runner reaps them
    recording.py     ``Recorder``: the records of finished actions and their
                     failures, written in groups (one transaction per round)
    failures.py      which failures are remembered (``judge``): only one kiln can
                     put down to the key; an action that failed so is not run
                     again with the same key
    failure_signs.py the surroundings' signs in an error or a log's bounded tail
    interruption.py  stopping a build: what runs is killed, what it half-wrote removed
"""
