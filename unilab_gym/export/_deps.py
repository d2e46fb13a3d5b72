"""The optional dependencies of :mod:`unilab_gym.export`, imported on first use with one clear error."""

from __future__ import annotations

from types import ModuleType

#: The command that installs what :mod:`unilab_gym.export` needs.
INSTALL_COMMAND = "pip install 'unilab-gym[export]'  (or: pip install onnx onnxruntime)"


def require_onnx() -> tuple[ModuleType, ModuleType]:
    """The ``onnx`` and ``onnxruntime`` modules.

    Raises:
        ImportError: either is not installed; the message names :data:`INSTALL_COMMAND`.
    """
    try:
        import onnx
        import onnxruntime
    except ImportError as error:
        raise ImportError(
            f"unilab_gym.export needs onnx and onnxruntime ({error}); install them with: {INSTALL_COMMAND}"
        ) from error
    return onnx, onnxruntime
