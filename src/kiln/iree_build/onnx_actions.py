"""``iree.build.onnx_actions``: ``onnx_import`` and its action."""

from kiln.actions.onnx import ImportOnnxAction as ImportOnnxAction
from kiln.actions.onnx import onnx_import

__all__ = ["onnx_import"]
