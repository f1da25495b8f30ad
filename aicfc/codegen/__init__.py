"""Codegen: one module per schedule family, each with its parameter space beside its template.

A family module provides `space(kernel, plan)`, `launch(kernel, params)`, `static_smem(kernel,
params)` and `render_kernel(kernel, params, types, name)`.
"""
from aicfc.codegen import attention, gemm, pointwise, row_reduce
from aicfc.codegen import conv, scatter, window

FAMILIES = {"pointwise": pointwise, "row_reduce": row_reduce, "gemm": gemm, "attention": attention}
FAMILIES.update({"conv": conv, "window": window, "scatter": scatter})
