"""How kiln runs programs for actions, in processes of their own.

    commands.py     ``CommandRunner``: commands started with ``posix_spawn``, no
                    thread each, reaped in one place (``run_command``)
    posix_spawn.py  ``posix_spawn`` with a working directory, through the C library
    template.py     the clean template process PROCESS actions' workers fork from
    worker.py       one worker process: runs one thunk; the framing kiln and it use
    worker_output.py  what a worker prints, escaped on its way to kiln's stderr
    pool.py         ``ProcessPool``: one fresh worker per thunk, from the template
    reaper.py       what a build leaves running is found and killed
    groups.py       signalling process groups, pidfds
    byvalue.py      build modules in a worker, their functions pickled by value

These modules take argvs, thunks and pids; only ``pool.py`` reads an action, to
say where its worker runs (``kiln.planning.sandbox.runs_in_output_dir``).
"""
