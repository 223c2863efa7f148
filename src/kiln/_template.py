"""Worker processes forked from a clean template (multiprocessing's fork server).

The fork server is a process started once, from a fresh interpreter, that
imports cloudpickle and kiln's worker code and then only forks: each worker is a
copy of that template, so nothing an earlier action did to its own worker can
reach the next one, and a worker starts in milliseconds instead of the hundreds
a fresh interpreter takes.

Unlike multiprocessing's own start methods, a worker does not re-import the
program's ``__main__`` module (a build module run as a script would run again
in every worker): thunks travel cloudpickled, by value where they must.
"""

from __future__ import annotations

import io
import os
from multiprocessing import forkserver, reduction, spawn, util
from multiprocessing.context import ForkServerProcess, set_spawning_popen
from multiprocessing.popen_forkserver import Popen as ForkServerPopen
from typing import Any

# Imported once, in the template: what unpickling kiln's own thunks needs. Never a
# build module: the template must stay clean.
TEMPLATE_MODULES = [
    "ctypes", "cloudpickle", "kiln._worker", "kiln.actions.iree", "kiln.actions.onnx"
]
_MAIN_KEYS = ("init_main_from_path", "init_main_from_name")


class _Popen(ForkServerPopen):
    """The fork server's Popen, launching without the ``__main__`` module."""

    def _launch(self, process_obj: Any) -> None:
        prep_data = spawn.get_preparation_data(process_obj._name)
        for key in _MAIN_KEYS:
            prep_data.pop(key, None)
        buf = io.BytesIO()
        set_spawning_popen(self)
        try:
            reduction.dump(prep_data, buf)
            reduction.dump(process_obj, buf)
        finally:
            set_spawning_popen(None)
        fds = self._fds  # type: ignore[attr-defined]  # (not in the stubs)
        self.sentinel, w = forkserver.connect_to_new_process(fds)
        # The child watches kiln through this duplicate of the data pipe's write end.
        parent_w = os.dup(w)
        close = util.close_fds  # type: ignore[attr-defined]  # (not in the stubs)
        self.finalizer = util.Finalize(self, close, (parent_w, self.sentinel))
        with open(w, "wb", closefd=True) as f:
            f.write(buf.getbuffer())
        self.pid = forkserver.read_signed(self.sentinel)


class TemplateProcess(ForkServerProcess):
    """A ``multiprocessing`` process forked from the clean template."""

    @staticmethod
    def _Popen(process_obj: Any) -> _Popen:  # noqa: N802 - multiprocessing's name
        forkserver.set_forkserver_preload(TEMPLATE_MODULES)
        return _Popen(process_obj)
