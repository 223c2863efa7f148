"""``iree.build.args``: command-line options of build modules (``cl_arg``)."""

from kiln.graph.args import (
    ClArg,
    ClArgRef,
    argument_namespace_context,
    cl_arg,
    cl_arg_ref,
    current_args_namespace,
    expand_cl_arg_defaults,
    extract_cl_arg_defs,
)

__all__ = [
    "ClArg",
    "ClArgRef",
    "argument_namespace_context",
    "cl_arg",
    "cl_arg_ref",
    "current_args_namespace",
    "expand_cl_arg_defaults",
    "extract_cl_arg_defs",
]
