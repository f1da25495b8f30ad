"""AICF's compiler: ONNX → High IR → Lowered IR → Decision-applied IR → CUDA → .aicf.

Public surface: `compile` (returns the bundle payload) and `compile_to_file`.
"""
__version__ = "0.1.0"


def compile(model, target: str = "sm_90", precision: str = "fp32", shapes=None, **options):
    """Compile an ONNX model (path or ModelProto) and return the bundle payload (a dict)."""
    from aicfc.driver import compile_model
    return compile_model(model, target=target, precision=precision, shapes=shapes, **options)


def compile_to_file(model, output, **options) -> dict:
    from aicfc.artifact import write_bundle
    from aicfc.driver import compile_model
    payload = compile_model(model, **options)
    write_bundle(payload, output)
    return payload


__all__ = ["compile", "compile_to_file", "__version__"]
