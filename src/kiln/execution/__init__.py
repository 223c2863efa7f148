"""Where an action's work runs: processes, threads, the cluster.

    process/          programs run for actions: ``CommandRunner`` (commands started
                      with ``posix_spawn``, reaped in one place), the worker template
                      and ``ProcessPool``, process groups, the reaper
    cluster/          a Dask cluster: the client (``DaskClient``), what a worker runs
                      in its sandbox (``RemoteTask``), which actions go and how their
                      outputs come back (``ClusterOffload``), worker versions, devices
    threads.py        ``ThreadWorkers``: the threads THREAD actions run on
    run_context.py    what a running action reaches besides its definition: the
                      reporter, its log, its files' metadata, its environment
    command_logs.py   where a command's output goes: straight to files

The engine decides what runs and when; this layer only runs what it is handed
and says when it ended.
"""
